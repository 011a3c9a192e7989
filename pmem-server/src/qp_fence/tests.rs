use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

/// A queue pair that says when it is destroyed.
struct FakeQp(Arc<AtomicBool>);

impl Drop for FakeQp {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A fence and its gauge.
fn fence() -> (Arc<QpFence>, Arc<Gauge>) {
    let gauge = Arc::new(Gauge::new());
    (Arc::new(QpFence::new(Arc::clone(&gauge))), gauge)
}

/// Sets a queue pair up on `binding` for `device` saying `epoch` while the
/// server runs `running`; returns whether it was destroyed so far.
fn connect(
    binding: &Binding,
    device: Option<&str>,
    epoch: Option<u64>,
    running: u64,
) -> Result<Arc<AtomicBool>, Refusal> {
    let destroyed = Arc::new(AtomicBool::new(false));
    let qp = FakeQp(Arc::clone(&destroyed));
    binding.admit(device, epoch, running, || Ok((Box::new(qp) as HeldQp, ())))?;
    Ok(destroyed)
}

#[test]
fn a_takeover_destroys_the_queue_pairs_of_connections_at_an_older_epoch() {
    let (fence, gauge) = fence();
    let old_owner = fence.bind();
    old_owner.said(Some(4));
    let old_qp = connect(&old_owner, None, None, 4).unwrap();
    let new_owner = fence.bind();
    new_owner.said(Some(5));
    let new_qp = connect(&new_owner, None, None, 4).unwrap();
    assert_eq!(gauge.get(), 2);

    assert_eq!(fence.fence(5, &[]), 1);
    assert!(
        old_qp.load(Ordering::SeqCst),
        "the old epoch's queue pair lives"
    );
    assert!(!new_qp.load(Ordering::SeqCst));
    assert_eq!((old_owner.held(), new_owner.held()), (0, 1));
    assert_eq!(gauge.get(), 1);
    assert_eq!(fence.fenced_at(), 5);
}

#[test]
fn a_deposed_owner_loses_its_queue_pairs_even_at_the_new_epoch() {
    // With --secrets the server knows the device: a deposed owner that said
    // the takeover's epoch first (its posts may still be in flight) is
    // fenced too; another device at that epoch is not.
    let (fence, _) = fence();
    let a = fence.bind();
    a.said(Some(5));
    let a_qp = connect(&a, Some("A"), None, 4).unwrap();
    let b = fence.bind();
    b.said(Some(5));
    let b_qp = connect(&b, Some("B"), None, 4).unwrap();

    assert_eq!(fence.fence(5, &["A".to_owned()]), 1);
    assert!(a_qp.load(Ordering::SeqCst));
    assert!(!b_qp.load(Ordering::SeqCst));
}

#[test]
fn a_connection_behind_the_fence_gets_no_queue_pair() {
    let (fence, gauge) = fence();
    fence.fence(5, &[]);
    let old = fence.bind();
    old.said(Some(4));
    // Judged by the connection's epoch, or by the one the QP_CONNECT says.
    assert_eq!(
        connect(&old, None, Some(4), 5).map(|_| ()),
        Err(Refusal::Stale { ours: 5 })
    );
    assert_eq!(
        connect(&old, None, Some(4), 0).map(|_| ()),
        Err(Refusal::Stale { ours: 5 })
    );
    // Behind the epoch the server runs, without a fence at it, as well.
    assert_eq!(
        connect(&old, None, Some(5), 6).map(|_| ()),
        Err(Refusal::Stale { ours: 6 })
    );
    assert_eq!(old.held(), 0);
    assert_eq!(gauge.get(), 0);
    // At the fence's epoch, or following no map, it is served.
    assert!(connect(&old, None, Some(5), 5).is_ok());
    assert!(connect(&old, None, None, 5).is_ok());
    assert_eq!(old.held(), 2);
}

#[test]
fn connections_that_follow_no_map_are_not_fenced() {
    let (fence, _) = fence();
    let file = fence.bind();
    let qp = connect(&file, None, None, 0).unwrap();
    assert_eq!(fence.fence(3, &[]), 0);
    assert!(!qp.load(Ordering::SeqCst));
}

#[test]
fn a_connection_that_moved_on_keeps_its_queue_pairs() {
    let (fence, _) = fence();
    let conn = fence.bind();
    conn.said(Some(4));
    let qp = connect(&conn, Some("B"), None, 4).unwrap();
    conn.said(Some(6));
    assert_eq!(fence.fence(6, &["A".to_owned()]), 0);
    assert!(!qp.load(Ordering::SeqCst));
}

#[test]
fn a_refused_set_up_holds_nothing_and_an_ended_connection_releases_its_queue_pairs() {
    let (fence, gauge) = fence();
    let conn = fence.bind();
    let refused = conn.admit(None, None, 0, || -> Result<(HeldQp, ()), _> {
        Err(proto::Status::IoError)
    });
    assert_eq!(refused, Err(Refusal::Failed(proto::Status::IoError)));
    let qp = connect(&conn, None, None, 0).unwrap();
    assert_eq!(gauge.get(), 1);
    drop(conn);
    assert!(qp.load(Ordering::SeqCst));
    assert_eq!(gauge.get(), 0);
    assert_eq!(fence.fence(9, &[]), 0);
}

#[test]
fn saying_an_epoch_behind_the_fence_destroys_the_queue_pairs_set_up_before() {
    // A device reconnecting sends QP_CONNECT before it says its epoch.
    let (fence, gauge) = fence();
    fence.fence(5, &[]);
    let conn = fence.bind();
    let qp = connect(&conn, Some("A"), None, 5).unwrap();
    conn.said(Some(4));
    assert!(qp.load(Ordering::SeqCst));
    assert_eq!(gauge.get(), 0);
    // One at the fence's epoch keeps them.
    let other = fence.bind();
    let kept = connect(&other, Some("B"), None, 5).unwrap();
    other.said(Some(5));
    assert!(!kept.load(Ordering::SeqCst));
}
