//! What a worker on etcd sees of the map moving under its workload: the
//! epoch its pool runs, and, for every region a new epoch brings (a server
//! added), when the first request to it was served: the last step of "a
//! new server's regions become usable by running clients".
//!
//! The worker prints both on its standard output as `key=value` words the
//! run reads: `epoch=N` with its progress, and one line per new region,
//! `first_use region=ID epoch=N first_use_unix_ms=T`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pmem_client::AsyncPool;
use topology::VirtAddr;

/// How often the pool's epoch is looked at, and how long a probe of a new
/// region waits before it tries again.
const POLL: Duration = Duration::from_millis(5);

/// The word that starts a first-use line.
pub const FIRST_USE: &str = "first_use";

/// The `first_use` line of region `region`, first served at `unix_ms` on
/// epoch `epoch`.
pub fn first_use_line(region: &str, epoch: u64, unix_ms: u64) -> String {
    format!("{FIRST_USE} region={region} epoch={epoch} first_use_unix_ms={unix_ms}")
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A task probing the regions new epochs bring, beside a worker's
/// workload.
#[derive(Debug)]
pub struct Prober {
    /// A new region is being probed and not served yet.
    busy: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Prober {
    /// Follows `pool` (on the current runtime): whenever its epoch moves on
    /// and brings regions the pool did not have, reads the first 8 bytes
    /// of each (a READ changes nothing the workload checks) until one is
    /// served, and prints its first-use line. A region the pool had at the
    /// opening is not probed.
    pub fn start(pool: AsyncPool) -> Self {
        let busy = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(probe_new_regions(pool, Arc::clone(&busy)));
        Self { busy, task }
    }

    /// Stops probing once no new region waits for its first request, or
    /// after `grace`: a probe under way when the workload ends is let
    /// finish, so its figure is not lost to the end of the run.
    pub async fn finish(self, grace: Duration) {
        let deadline = tokio::time::Instant::now() + grace;
        while self.busy.load(Ordering::Relaxed) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(POLL).await;
        }
        self.task.abort();
    }
}

async fn probe_new_regions(pool: AsyncPool, busy: Arc<AtomicBool>) {
    let mut known: BTreeSet<String> = pool.regions().into_iter().map(|r| r.0).collect();
    let mut epoch = pool.map_epoch();
    loop {
        tokio::time::sleep(POLL).await;
        let now = pool.map_epoch();
        if now == epoch {
            continue;
        }
        epoch = now;
        for (region, start, _) in pool.regions() {
            if known.contains(&region) {
                continue;
            }
            busy.store(true, Ordering::Relaxed);
            served(&pool, start).await;
            println!("{}", first_use_line(&region, epoch, unix_ms_now()));
            known.insert(region);
        }
        busy.store(false, Ordering::Relaxed);
    }
}

/// Returns once a READ at `start` was served.
async fn served(pool: &AsyncPool, start: VirtAddr) {
    while pool.read(start, 8).await.is_err() {
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_use_line_is_words_the_run_reads() {
        let line = first_use_line("B1", 2, 1_700_000_000_123);
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[0], FIRST_USE);
        assert!(words.contains(&"region=B1"));
        assert!(words.contains(&"epoch=2"));
        assert!(words.contains(&"first_use_unix_ms=1700000000123"));
    }
}
