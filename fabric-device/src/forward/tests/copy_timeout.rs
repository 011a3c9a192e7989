//! The copy timeout on a virtual clock: a copy of a replicated region that
//! stays silent while another answers is lost at the copy timeout, well
//! before the request timeout, and the operation goes on with the other
//! copy; the last serving copy, and copies that are all late together,
//! wait for the request timeout.

use std::time::Duration;

use super::replication::{answer, answered, index, replicated, send_read, split};
use super::*;

/// The copy timeout and the request timeout of the cores here.
fn timeouts() -> (Duration, Duration) {
    let config = ForwarderConfig::default();
    assert!(config.copy_timeout < config.request_timeout);
    (config.copy_timeout, config.request_timeout)
}

fn write(core: &mut Forwarder, tag: u64, byte: u8) {
    let frame = Message::Request(Repr::write(
        pmem(core, "PA.1", 0),
        key(core, "PA.1"),
        &[byte; 8],
    ))
    .encode_to_vec(tag)
    .unwrap();
    assert!(matches!(
        core.client_frame(1, &frame, Instant::now()),
        ClientAction::Nothing
    ));
}

#[test]
fn a_silent_copy_is_lost_at_the_copy_timeout_and_the_write_answered_ok() {
    let (copy_timeout, _) = timeouts();
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let before = Instant::now();
    write(&mut core, 10, 6);
    let after = Instant::now();
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 2, "both copies written");
    // The primary on A answers; the backup on B stays silent.
    answer(&mut core, &sent[0], Status::Ok, 0);
    assert_eq!(
        core.poll_timeout().map(|t| t <= after + copy_timeout),
        Some(true),
        "the core wakes up for the copy timeout"
    );
    let (replies, silent) = core.handle_timeouts(before + copy_timeout - Duration::from_millis(1));
    assert!(replies.is_empty() && silent.is_empty(), "not yet");
    assert!(split(core.take_outbox()).2.is_empty());

    let (replies, silent) = core.handle_timeouts(after + copy_timeout);
    assert!(replies.is_empty(), "no TIMEOUT for the client");
    assert_eq!(silent, [sent[1].link], "the silent copy's link is closed");
    let (_, answers, lost) = split(core.take_outbox());
    assert!(answers.is_empty(), "held until the loss is marked");
    assert_eq!(lost, [(pa1, "B".to_owned())]);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 10));
}

#[test]
fn the_last_serving_copy_waits_for_the_request_timeout() {
    let (copy_timeout, request_timeout) = timeouts();
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    // B's copy is lost first (its link breaks under a write).
    write(&mut core, 1, 1);
    let (sent, _, _) = split(core.take_outbox());
    core.link_down(sent[1].link);
    core.copy_marked(pa1, &"B".into(), Instant::now());
    answer(&mut core, &sent[0], Status::Ok, 0);
    core.take_outbox();

    let after = {
        write(&mut core, 2, 2);
        Instant::now()
    };
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 1, "A's copy alone");
    let (replies, silent) = core.handle_timeouts(after + copy_timeout);
    assert!(replies.is_empty() && silent.is_empty());
    let (_, answers, lost) = split(core.take_outbox());
    assert!(
        answers.is_empty() && lost.is_empty(),
        "a slow last copy is waited for: {answers:?} {lost:?}"
    );

    let (_, silent) = core.handle_timeouts(after + request_timeout);
    assert_eq!(silent, [sent[0].link]);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty(), "server A's copy stays serving");
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1).0, Status::Timeout);
}

#[test]
fn copies_late_together_wait_for_the_request_timeout() {
    let (copy_timeout, request_timeout) = timeouts();
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    write(&mut core, 3, 3);
    let after = Instant::now();
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 2);
    // Neither copy answers: nothing tells the dead one from the slow one.
    let (replies, silent) = core.handle_timeouts(after + copy_timeout);
    assert!(replies.is_empty() && silent.is_empty());
    let (_, answers, lost) = split(core.take_outbox());
    assert!(
        answers.is_empty() && lost.is_empty(),
        "{answers:?} {lost:?}"
    );
    // Server A answers after all: B, still silent, is the one to go.
    answer(&mut core, &sent[0], Status::Ok, 0);
    let (_, silent) = core.handle_timeouts(after + request_timeout);
    assert_eq!(silent, [sent[1].link]);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(answers.is_empty());
    assert_eq!(lost, [(pa1, "B".to_owned())]);
}

#[test]
fn a_read_of_a_silent_copy_goes_to_the_other_at_the_copy_timeout() {
    let (copy_timeout, _) = timeouts();
    let mut core = replicated();
    let pa1 = index(&core, "PA.1");
    let (read, _) = send_read(
        &mut core,
        |c| Repr::read(pmem(c, "PA.1", 32), key(c, "PA.1"), 8),
        7,
    );
    let after = Instant::now();
    let reads = [read];
    let first = core.link_target(reads[0].link).unwrap().server.to_string();

    let (replies, silent) = core.handle_timeouts(after + copy_timeout);
    assert!(replies.is_empty());
    assert_eq!(silent, [reads[0].link]);
    let (again, answers, lost) = split(core.take_outbox());
    assert!(answers.is_empty());
    assert_eq!(lost, [(pa1, first.clone())]);
    assert_eq!(again.len(), 1, "the read goes to the other copy");
    let second = core.link_target(again[0].link).unwrap().server.to_string();
    assert_ne!(second, first);
    let data = 42u64.to_le_bytes();
    let frame = server_response(again[0].tag, Status::Ok, &data);
    match core.link_frame(again[0].link, &frame, Instant::now()) {
        LinkAction::Deliver { conn, payload, .. } => {
            assert_eq!((conn, payload), (1, &data[..]), "the client gets the data");
        }
        other => panic!("the read is not answered: {other:?}"),
    }
}
