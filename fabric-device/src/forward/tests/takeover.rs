//! Owner failover in the core, on device A of the default topology with
//! `replicas = 2` (A owns PA.1 and PB.1, B owns PA.2 and PB.2): a suspected
//! owner reported, a new owner holding its requests until the copies'
//! servers run its map, a deposed owner answering what it queued
//! NOT_OWNER, and a server's NOT_OWNER taken for no lost copy.

use std::time::Duration;

use proto::request::Operation;

use super::replication::{Sent, answer, answered, index, replicated, send, split};
use super::*;
use crate::forward::Outgoing;
use crate::forward::{HeardSince, OwnedRegion};
use crate::link_tags::MAP_EPOCH_TAG;

/// The owners suspected in an outbox, in order.
fn suspected(out: &[Outgoing]) -> Vec<String> {
    out.iter()
        .filter_map(|o| match o {
            Outgoing::OwnerSuspected { owner } => Some(owner.to_string()),
            _ => None,
        })
        .collect()
}

fn write_at(core: &mut Forwarder, region: &str, tag: u64, now: Instant) -> ClientAction<'static> {
    let frame = Message::Request(Repr::write(
        pmem(core, region, 0),
        key(core, region),
        &[3; 8],
    ))
    .encode_to_vec(tag)
    .unwrap();
    match core.client_frame(1, &frame, now) {
        ClientAction::Nothing => ClientAction::Nothing,
        ClientAction::Reply(r) => ClientAction::Reply(r),
        other => panic!("{other:?}"),
    }
}

/// The map of device A where `region`'s record says owner `owner`, version
/// `version`, and B's copy syncing (as a takeover leaves it).
pub(super) fn map_with_owner(region: &str, owner: &str, version: u64) -> DeviceMap {
    let topology = testkit::default_topology_with("replicas = 2");
    let mut records = control::replica_state::initial(&topology);
    let record = records.iter_mut().find(|r| r.region == region).unwrap();
    record.owner = owner.into();
    record.version = version;
    for copy in &mut record.copies {
        if copy.server == "B" {
            copy.state = control::ReplicaState::Syncing;
        }
    }
    DeviceMap::new(&topology, &"A".into())
        .unwrap()
        .with_replica_states(&records)
}

/// A server's answer to the device's MAP_EPOCH on `link`: it runs `epoch`.
pub(super) fn server_runs(core: &mut Forwarder, link: LinkId, epoch: u64, now: Instant) {
    let reply = proto::fence::epoch_reply(Opcode::MapEpoch, MAP_EPOCH_TAG, Status::Ok, epoch);
    assert!(matches!(
        core.link_frame(link, &reply, now),
        LinkAction::Nothing
    ));
}

#[test]
fn a_request_for_another_owners_region_reports_the_owner_once_per_window() {
    let mut core = replicated();
    let t0 = Instant::now();
    assert_eq!(
        refused(write_at(&mut core, "PA.2", 1, t0)),
        Status::NotOwner
    );
    assert_eq!(suspected(&core.take_outbox()), ["B"]);
    // Within the window: answered, not reported again.
    let soon = t0 + Duration::from_millis(1);
    assert_eq!(
        refused(write_at(&mut core, "PB.2", 2, soon)),
        Status::NotOwner
    );
    assert!(suspected(&core.take_outbox()).is_empty());
    let later = t0 + crate::forward::replication::SUSPECT_EVERY;
    assert_eq!(
        refused(write_at(&mut core, "PA.2", 3, later)),
        Status::NotOwner
    );
    assert_eq!(suspected(&core.take_outbox()), ["B"]);
    // Its own regions are nobody's suspicion.
    write_at(&mut core, "PA.1", 4, later);
    assert!(suspected(&core.take_outbox()).is_empty());
}

#[test]
fn the_regions_of_an_owner_are_listed_with_their_versions_for_a_takeover() {
    let core = replicated();
    let of_b = core.owned_by(&"B".into());
    let ids: Vec<&str> = of_b.iter().map(|r| r.region.as_str()).collect();
    assert_eq!(ids, ["PA.2", "PB.2"]);
    assert!(of_b.iter().all(|r| r.version == 1 && r.reachable));
    assert_eq!(
        core.owned_by(&"A".into())
            .into_iter()
            .map(|r| r.region.to_string())
            .collect::<Vec<_>>(),
        ["PA.1", "PB.1"]
    );
    // Without a link up to a serving copy, A cannot take a region over.
    let mut cut = replicated();
    let links: Vec<LinkId> = cut.links().map(|(id, _)| id).collect();
    for link in links {
        cut.link_down(link);
    }
    assert!(
        cut.owned_by(&"B".into())
            .iter()
            .all(|r: &OwnedRegion| !r.reachable)
    );
    // With server A's links down, A's copies are listed as not reached:
    // a takeover passes them over as the deciding copy.
    let mut half = replicated();
    let to_a: Vec<LinkId> = half
        .links()
        .filter(|(_, key)| key.server.as_str() == "A")
        .map(|(id, _)| id)
        .collect();
    for link in to_a {
        half.link_down(link);
    }
    for region in half.owned_by(&"B".into()) {
        assert!(region.reachable, "{region:?}");
        let reached: Vec<(&str, bool)> = region
            .serving
            .iter()
            .map(|(s, up)| (s.as_str(), *up))
            .collect();
        assert!(reached.contains(&("A", false)), "{region:?}");
        assert!(reached.contains(&("B", true)), "{region:?}");
    }
}

#[test]
fn a_new_owner_sends_nothing_until_every_copys_server_runs_its_epoch() {
    let mut core = replicated();
    let now = Instant::now();
    core.set_epoch(4);
    for server in ["A", "B"] {
        let l = link(&core, server, "n0");
        server_runs(&mut core, l, 4, now);
    }
    // A takes PA.2 over: the map at epoch 5 names it.
    core.reload(map_with_owner("PA.2", "A", 2));
    let said = core.set_epoch(5);
    assert!(!said.is_empty(), "MAP_EPOCH on every link that is up");
    assert!(matches!(
        write_at(&mut core, "PA.2", 7, now),
        ClientAction::Nothing
    ));
    let (sent, answers, _) = split(core.take_outbox());
    assert!(sent.is_empty() && answers.is_empty(), "it waits: {sent:?}");
    // Server A is behind: still waiting; MAP_EPOCH is said to both again,
    // on the links PA.2's copies are written on (their socket's NIC).
    let (a, b) = (link(&core, "A", "n1"), link(&core, "B", "n1"));
    server_runs(&mut core, a, 4, now);
    let again = core.fence_resends(now);
    let to: Vec<LinkId> = again.iter().map(|(l, _)| *l).collect();
    assert_eq!(to, [a, b]);
    assert!(
        core.fence_resends(now).is_empty(),
        "not before the next period"
    );
    assert!(split(core.take_outbox()).0.is_empty());
    server_runs(&mut core, a, 5, now);
    assert!(split(core.take_outbox()).0.is_empty(), "B has not said");
    let next = now + crate::forward::replication::RESAY_EVERY;
    let again: Vec<LinkId> = core.fence_resends(next).iter().map(|(l, _)| *l).collect();
    assert_eq!(again, [b], "only the server not confirmed yet");
    server_runs(&mut core, b, 6, next);
    // Both run epoch 5 or newer: the write goes to every copy that takes
    // writes (B's is syncing), in order.
    let (sent, _, _) = split(core.take_outbox());
    let to: Vec<(LinkId, Operation)> = sent.iter().map(|s| (s.link, s.operation)).collect();
    assert_eq!(to, [(a, Operation::Write), (b, Operation::Write)]);
    for s in &sent {
        answer(&mut core, s, Status::Ok, 0);
    }
    let (_, answers, _) = split(core.take_outbox());
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 7));
    // From now on, requests go at once.
    write_at(&mut core, "PA.2", 8, next);
    assert_eq!(split(core.take_outbox()).0.len(), 2);
    assert!(core.fence_resends(next + Duration::from_secs(1)).is_empty());
}

#[test]
fn a_server_that_never_confirms_loses_its_copy_after_the_request_timeout() {
    let mut core = replicated();
    let now = Instant::now();
    core.reload(map_with_owner("PA.2", "A", 2));
    core.set_epoch(5);
    // Server A confirms, B (its links up) never does.
    let a = link(&core, "A", "n1");
    server_runs(&mut core, a, 5, now);
    core.fence_resends(now);
    write_at(&mut core, "PA.2", 9, now);
    assert!(split(core.take_outbox()).0.is_empty());
    let timeout = ForwarderConfig::default().request_timeout;
    assert!(core.poll_timeout().is_some_and(|t| t <= now + timeout));
    core.fence_resends(now + timeout);
    let (sent, _, lost) = split(core.take_outbox());
    let pa2 = index(&core, "PA.2");
    assert!(lost.contains(&(pa2, "B".to_owned())), "{lost:?}");
    assert!(lost.iter().all(|(_, server)| server == "B"), "{lost:?}");
    let to: Vec<LinkId> = sent.iter().map(|s: &Sent| s.link).collect();
    assert_eq!(to, [a], "to the confirmed copy only");
}

#[test]
fn the_gated_housekeeping_says_map_epoch_again_and_gives_up_at_their_deadlines() {
    let mut core = replicated();
    let now = Instant::now();
    core.set_epoch(4);
    for server in ["A", "B"] {
        let l = link(&core, server, "n0");
        server_runs(&mut core, l, 4, now);
    }
    assert_eq!(core.replication_turn(now), [], "every fence confirmed");
    // A takes PA.2 over at epoch 5. Server A confirms, B (its links up)
    // never does.
    core.reload(map_with_owner("PA.2", "A", 2));
    core.set_epoch(5);
    let (a, b) = (link(&core, "A", "n1"), link(&core, "B", "n1"));
    server_runs(&mut core, a, 5, now);
    // B's copy of PA.2 is syncing: its resync's own frames are not looked at.
    let without_resync = |out: Vec<Outgoing>| -> Vec<Outgoing> {
        out.into_iter()
            .filter(|o| !matches!(o, Outgoing::SendFrame { .. }))
            .collect()
    };
    let said = |core: &mut Forwarder, at| -> Vec<LinkId> {
        core.replication_turn(at).iter().map(|(l, _)| *l).collect()
    };
    assert_eq!(said(&mut core, now), [b], "the first pass says it");
    write_at(&mut core, "PA.2", 9, now);
    assert!(
        split(without_resync(core.take_outbox())).0.is_empty(),
        "it waits"
    );
    let resay = now + crate::forward::replication::RESAY_EVERY;
    assert!(resay - now < crate::housekeeping::FALLBACK);
    assert_eq!(core.housekeeping_next(), Some(resay));
    assert!(said(&mut core, resay - Duration::from_micros(1)).is_empty());
    // Nothing happened since: only the deadline makes it due.
    assert_eq!(said(&mut core, resay), [b], "said again at its period");
    let timeout = ForwarderConfig::default().request_timeout;
    let mut at = resay;
    while at < now + timeout {
        at += crate::forward::replication::RESAY_EVERY;
        said(&mut core, at.min(now + timeout));
    }
    let (sent, _, lost) = split(without_resync(core.take_outbox()));
    let pa2 = index(&core, "PA.2");
    assert_eq!(lost, [(pa2, "B".to_owned())], "given up at the timeout");
    let to: Vec<LinkId> = sent.iter().map(|s: &Sent| s.link).collect();
    assert_eq!(to, [a], "the write goes to the confirmed copy");
}

#[test]
fn a_deposed_owner_answers_what_it_had_queued_not_owner() {
    let mut core = replicated();
    let pa1 = index(&core, "PA.1").0;
    let now = Instant::now();
    assert!(core.hold_for_resync(pa1, 0, 4096));
    assert!(matches!(
        write_at(&mut core, "PA.1", 5, now),
        ClientAction::Nothing
    ));
    assert!(split(core.take_outbox()).0.is_empty());
    // The map gives PA.1 to B.
    core.reload(map_with_owner("PA.1", "B", 2));
    let (sent, answers, _) = split(core.take_outbox());
    assert!(sent.is_empty());
    assert_eq!(answers.len(), 1);
    assert_eq!(answered(&answers[0].1).0, Status::NotOwner);
    assert_eq!(answered(&answers[0].1).2, 5);
    assert_eq!(core.requests_in_flight(), 0);
    // New requests too, with B suspected only if a client keeps coming.
    assert_eq!(
        refused(write_at(&mut core, "PA.1", 6, now)),
        Status::NotOwner
    );
}

#[test]
fn a_server_saying_not_owner_loses_no_copy_and_calls_for_the_map() {
    let mut core = replicated();
    send(
        &mut core,
        |c| Repr::write(pmem(c, "PA.1", 0), key(c, "PA.1"), &[1; 8]),
        3,
    );
    let (sent, _, _) = split(core.take_outbox());
    assert_eq!(sent.len(), 2);
    answer(&mut core, &sent[0], Status::Ok, 0);
    answer(&mut core, &sent[1], Status::NotOwner, 0);
    let (_, answers, lost) = split(core.take_outbox());
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(answered(&answers[0].1), (Status::Ok, 0, 3));
    assert!(core.take_map_reread());
}

#[test]
fn a_client_ahead_of_this_device_is_told_stale_map_not_not_owner() {
    let mut core = replicated();
    core.set_epoch(5);
    let t0 = Instant::now();
    // NOT_OWNER says the device's epoch.
    let ClientAction::Reply(reply) = write_at(&mut core, "PA.2", 39, t0) else {
        panic!("answered at once");
    };
    assert_eq!(answered(&reply), (Status::NotOwner, 5, 39));
    assert_eq!(suspected(&core.take_outbox()), ["B"]);
    let said = Message::MapEpoch(6).encode_to_vec(40).unwrap();
    let _ = core.client_frame(1, &said, t0);
    // Its newer map may name this device the owner of PA.2: it comes back
    // once the device runs that map, and no owner is suspected for it.
    let later = t0 + crate::forward::replication::SUSPECT_EVERY;
    let ClientAction::Reply(reply) = write_at(&mut core, "PA.2", 41, later) else {
        panic!("answered at once");
    };
    assert_eq!(answered(&reply), (Status::StaleMap, 5, 41));
    assert!(suspected(&core.take_outbox()).is_empty());
}

#[test]
fn what_a_server_said_since_a_takeover_decides_whether_its_deciding_role_may_move() {
    let mut core = replicated();
    let now = Instant::now();
    let server = topology::ServerId::from("A");
    let second = Duration::from_secs(1);
    let a = link(&core, "A", "n0");
    server_runs(&mut core, a, 4, now);
    assert_eq!(core.server_heard_since(&server, now), HeardSince::Answered);
    assert_eq!(
        core.server_heard_since(&server, now + second),
        HeardSince::Linked,
        "said nothing since, but its links are up"
    );
    let a_links: Vec<LinkId> = core
        .links()
        .filter(|(_, k)| k.server.as_str() == "A")
        .map(|(id, _)| id)
        .collect();
    for l in &a_links[1..] {
        core.link_down(*l);
    }
    assert_eq!(
        core.server_heard_since(&server, now + second),
        HeardSince::Linked,
        "one link is still up"
    );
    core.link_down(a_links[0]);
    assert_eq!(
        core.server_heard_since(&server, now + second),
        HeardSince::Silent
    );
    assert_eq!(
        core.server_heard_since(&server, now),
        HeardSince::Answered,
        "what it said stays said"
    );
}
