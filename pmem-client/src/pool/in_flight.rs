//! The operations in flight, so `fence` can wait for all begun before it.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

use super::lock;

/// Operations in flight, for `fence`.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    next: AtomicU64,
    active: Mutex<BTreeSet<u64>>,
    settled: Notify,
}

/// Marks one operation in flight until dropped.
pub(super) struct OpGuard<'a>(&'a InFlight, u64);

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        lock(&self.0.active).remove(&self.1);
        self.0.settled.notify_waiters();
    }
}

impl InFlight {
    pub(super) fn begin(&self) -> OpGuard<'_> {
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        lock(&self.active).insert(id);
        OpGuard(self, id)
    }

    /// Waits until every operation begun before this call has finished.
    pub(super) async fn fence(&self) {
        let upto = self.next.load(Ordering::SeqCst);
        loop {
            let settled = self.settled.notified();
            if lock(&self.active)
                .first()
                .is_none_or(|first| *first >= upto)
            {
                return;
            }
            settled.await;
        }
    }
}
