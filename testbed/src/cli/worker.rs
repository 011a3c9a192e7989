//! `testbed worker`: one client process of a run, started by `run`, `demo`
//! and `chaos`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use pmem_client::ServerCache;

use super::args::*;
use crate::workload::{Progress, WorkerConfig};

/// `testbed worker`: one client process of a run.
pub fn worker_command(args: WorkerArgs) -> anyhow::Result<bool> {
    let WorkerArgs {
        map,
        client,
        index,
        clients,
        workload,
        duration_ms,
        size,
        depth,
        keys,
        seed,
        start_unix_ms,
        bucket_ms,
        zipfian,
        server_cache,
        clear,
        held_open,
        out,
    } = args;
    let client_id = client.clone();
    let worker_config = WorkerConfig {
        client,
        index,
        clients,
        workload,
        zipfian,
        duration: Duration::from_millis(duration_ms),
        size: size.max(16),
        depth,
        keys,
        seed,
        bucket_ms,
        clear,
        held_open,
        history: out
            .parent()
            .map(|dir| crate::workload::register::history_path(dir, &client_id)),
    };
    worker(worker_config, map, server_cache, start_unix_ms, out).map(|()| true)
}

/// Runs one worker of a run on the pool from `map`, its workload starting
/// at `start_unix_ms`, and writes its result to `out`.
pub fn worker(
    config: WorkerConfig,
    map: ::control::MapFlags,
    server_cache: ServerCache,
    start_unix_ms: u64,
    out: PathBuf,
) -> anyhow::Result<()> {
    let source = map.source()?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let run_start = Instant::now()
        .checked_sub(Duration::from_millis(now_ms.saturating_sub(start_unix_ms)))
        .unwrap_or_else(Instant::now);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let result = runtime.block_on(async move {
        let pool = open_pool(source, config.client.as_str(), server_cache).await?;
        let space = crate::workload::space::open(&pool)
            .await
            .map_err(|why| anyhow::anyhow!("where the keys live: {why}"))?;
        if config.clear {
            crate::workload::clear_slice(&pool, space, &config)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("clear the slice: {}", pmem_client::error_chain(&e))
                })?;
        }
        let progress = std::sync::Arc::new(Progress::default());
        println!("{}", crate::workload::STARTED_LINE);
        let reporter = {
            let progress = std::sync::Arc::clone(&progress);
            let pool = pool.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    println!(
                        "progress ops={} errors={} epoch={}",
                        progress.ops.load(std::sync::atomic::Ordering::Relaxed),
                        progress.errors.load(std::sync::atomic::Ordering::Relaxed),
                        pool.map_epoch()
                    );
                }
            })
        };
        // A pool that follows the map: say when regions a new epoch brings
        // are first served.
        let prober =
            (pool.map_epoch() > 0).then(|| crate::workload::first_use::Prober::start(pool.clone()));
        let result = crate::workload::run(pool, config, space, run_start, progress).await;
        if let Some(prober) = prober {
            prober.finish(Duration::from_secs(30)).await;
        }
        reporter.abort();
        anyhow::Ok(result)
    })?;
    let text = serde_json::to_string(&result)?;
    std::fs::write(&out, text).with_context(|| format!("write {}", out.display()))?;
    Ok(())
}

/// Opens the pool as `client` from `source`: a topology file, or etcd (the
/// pool then follows the map), asking the servers for `server_cache` on
/// writes. Keys come from `$PMEM_FABRIC_SECRETS`.
pub async fn open_pool(
    source: ::control::MapSource,
    client: &str,
    server_cache: ServerCache,
) -> anyhow::Result<pmem_client::AsyncPool> {
    let builder = match source {
        ::control::MapSource::File(path) => {
            let topology = topology::Topology::load(&path)?;
            pmem_client::AsyncPool::builder(topology, client)
        }
        ::control::MapSource::Etcd {
            endpoints,
            pool,
            credentials,
        } => {
            let builder = pmem_client::AsyncPool::builder_on_etcd(endpoints, &pool, client);
            match credentials {
                Some(credentials) => builder.etcd_credentials(credentials),
                None => builder,
            }
        }
    };
    builder
        .server_cache(server_cache)
        .connect_async()
        .await
        .map_err(|e| anyhow::anyhow!(pmem_client::error_chain(&e)))
}
