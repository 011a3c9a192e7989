//! Requests that wait for links still on their first attempt.

use super::*;

#[test]
fn requests_wait_for_links_still_on_their_first_attempt() {
    let mut core = core();
    hello(&mut core, 1, "c1");
    let t0 = Instant::now();
    let req = Message::Request(Repr::read(pmem(&core, "PA.1", 0), key(&core, "PA.1"), 8))
        .encode_to_vec(7)
        .unwrap();
    assert!(matches!(
        core.client_frame(1, &req, t0),
        ClientAction::Nothing
    ));
    assert!(core.take_unparked().is_empty(), "no link up yet");
    assert!(
        core.poll_timeout().is_some(),
        "the parked request has a deadline"
    );
    all_up(&mut core);
    let unparked = core.take_unparked();
    assert_eq!(unparked, vec![(1, req.clone())]);
    assert!(matches!(
        core.client_frame(1, &unparked[0].1, t0),
        ClientAction::Forward { .. }
    ));
}

#[test]
fn parked_requests_fail_when_the_first_attempt_fails_or_time_runs_out() {
    let mut core = core();
    hello(&mut core, 1, "c1");
    let t0 = Instant::now();
    let read = |core: &Forwarder, region: &str, tag| {
        Message::Request(Repr::read(pmem(core, region, 0), key(core, region), 8))
            .encode_to_vec(tag)
            .unwrap()
    };
    let (a, b) = (read(&core, "PA.1", 1), read(&core, "PB.2", 2));
    assert!(matches!(
        core.client_frame(1, &a, t0),
        ClientAction::Nothing
    ));
    assert!(matches!(
        core.client_frame(1, &b, t0),
        ClientAction::Nothing
    ));
    // Server A's links both fail their first connect: its request is
    // refused, server B's keeps waiting.
    for nic in ["n0", "n1"] {
        let id = link(&core, "A", nic);
        core.link_down(id);
    }
    let unparked = core.take_unparked();
    assert_eq!(unparked.len(), 1);
    assert_eq!(
        refused(core.client_frame(1, &unparked[0].1, t0)),
        Status::ServerUnavailable
    );
    // Now a request for A fails at once: A is no longer starting.
    assert_eq!(
        refused(core.client_frame(1, &a, t0)),
        Status::ServerUnavailable
    );
    let late = t0 + ForwarderConfig::default().request_timeout;
    let (replies, _) = core.handle_timeouts(late);
    let statuses: Vec<_> = replies.iter().map(|(_, r)| status_of(r)).collect();
    assert_eq!(statuses, vec![(Status::Timeout, 2)]);
    assert_eq!(core.poll_timeout(), None);
}
