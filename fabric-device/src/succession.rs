//! Who takes over a dead owner's replicated regions, sans-IO.
//!
//! A device suspects a region's owner when a client sends it a request for
//! that region (the client's paths to the owner are down, or its map is
//! behind). Suspicion alone decides nothing: the owner is probed, and only
//! an owner judged dead ([`judge`]) is replaced. The successor is chosen
//! deterministically so devices do not race: the fabric devices in the
//! topology's order, starting after the owner and wrapping around
//! ([`successors`]); a device takes over only when every device before it
//! in that order is judged dead too ([`decide`]). Two devices that still
//! race (their probes disagreed) both write against the region's version:
//! one wins, the other reads a newer map.

use topology::FabricDeviceId;

/// What a TCP connect to each of a device's client ports found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// A port accepted the connection (a process listens; it may still be
    /// frozen: the kernel accepts for it).
    Accepted,
    /// Every port refused: nothing listens there.
    Refused,
    /// No port answered either way in time, or the device has no port
    /// this device can reach: says nothing.
    Unknown,
}

/// Whether a device is alive, as far as a probe can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// It listens and holds its liveness lease (or no etcd says otherwise).
    Alive,
    /// Its ports refuse connections, or its lease is gone.
    Dead,
    /// Nothing conclusive: do not act on it.
    Unknown,
}

/// Judges a device from a connect probe and its liveness lease in etcd
/// (`Some(true)`: the record is there; `Some(false)`: gone; `None`: not
/// known). A refused connect is a dead process (or one restarting); a
/// lease gone is a process that stopped keeping it alive, dead or frozen
/// past its TTL. A frozen process still accepts connections, so only its
/// lease tells.
pub fn judge(reach: Reach, lease: Option<bool>) -> Liveness {
    match (reach, lease) {
        (Reach::Refused, _) | (_, Some(false)) => Liveness::Dead,
        (Reach::Accepted, _) | (Reach::Unknown, Some(true)) => Liveness::Alive,
        (Reach::Unknown, None) => Liveness::Unknown,
    }
}

/// The devices that may take over from `owner`, in the order they try:
/// `devices` (the topology's order) starting after `owner`, wrapping
/// around, `owner` left out.
pub fn successors(devices: &[FabricDeviceId], owner: &FabricDeviceId) -> Vec<FabricDeviceId> {
    let start = devices
        .iter()
        .position(|d| d == owner)
        .map_or(0, |at| at + 1);
    (0..devices.len())
        .map(|i| &devices[(start + i) % devices.len()])
        .filter(|d| *d != owner)
        .cloned()
        .collect()
}

/// What this device does about a suspected owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The owner is alive (or not known dead): nothing changes.
    OwnerAlive,
    /// A device before this one in the order is alive: it takes over.
    Defer(FabricDeviceId),
    /// This device is not among the successors (not in the topology).
    NotASuccessor,
    /// Take the owner's regions over.
    TakeOver,
}

/// Decides for `me` about `owner`: take over when the owner is dead and so
/// is every successor before `me`; `probe` judges a device (called for the
/// owner first, then for those before `me`, in order, until one is not
/// dead).
pub fn decide(
    devices: &[FabricDeviceId],
    me: &FabricDeviceId,
    owner: &FabricDeviceId,
    mut probe: impl FnMut(&FabricDeviceId) -> Liveness,
) -> Decision {
    if probe(owner) != Liveness::Dead {
        return Decision::OwnerAlive;
    }
    for candidate in successors(devices, owner) {
        if &candidate == me {
            return Decision::TakeOver;
        }
        if probe(&candidate) != Liveness::Dead {
            return Decision::Defer(candidate);
        }
    }
    Decision::NotASuccessor
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<FabricDeviceId> {
        names.iter().map(|n| FabricDeviceId::new(*n)).collect()
    }

    fn id(name: &str) -> FabricDeviceId {
        FabricDeviceId::new(name)
    }

    #[test]
    fn a_refused_connect_or_a_lost_lease_is_death_an_answer_or_a_lease_is_life() {
        assert_eq!(judge(Reach::Refused, None), Liveness::Dead);
        assert_eq!(judge(Reach::Refused, Some(true)), Liveness::Dead);
        // Frozen past its lease: the kernel still accepts for it.
        assert_eq!(judge(Reach::Accepted, Some(false)), Liveness::Dead);
        assert_eq!(judge(Reach::Unknown, Some(false)), Liveness::Dead);
        assert_eq!(judge(Reach::Accepted, Some(true)), Liveness::Alive);
        assert_eq!(judge(Reach::Accepted, None), Liveness::Alive);
        assert_eq!(judge(Reach::Unknown, Some(true)), Liveness::Alive);
        assert_eq!(judge(Reach::Unknown, None), Liveness::Unknown);
    }

    #[test]
    fn successors_follow_the_topologys_order_after_the_owner() {
        let devices = ids(&["A", "B", "C", "D"]);
        assert_eq!(successors(&devices, &id("B")), ids(&["C", "D", "A"]));
        assert_eq!(successors(&devices, &id("D")), ids(&["A", "B", "C"]));
        // An owner the topology no longer names: everyone, in order.
        assert_eq!(successors(&devices, &id("Z")), ids(&["A", "B", "C", "D"]));
        assert!(successors(&ids(&["A"]), &id("A")).is_empty());
    }

    #[test]
    fn the_first_live_successor_takes_over_the_others_defer() {
        let devices = ids(&["A", "B", "C"]);
        let dead = |dead: &'static [&'static str]| {
            move |d: &FabricDeviceId| {
                if dead.contains(&d.as_str()) {
                    Liveness::Dead
                } else {
                    Liveness::Alive
                }
            }
        };
        // A dies: B is next after A and takes over; C defers to B.
        assert_eq!(
            decide(&devices, &id("B"), &id("A"), dead(&["A"])),
            Decision::TakeOver
        );
        assert_eq!(
            decide(&devices, &id("C"), &id("A"), dead(&["A"])),
            Decision::Defer(id("B"))
        );
        // A and B dead: C takes over.
        assert_eq!(
            decide(&devices, &id("C"), &id("A"), dead(&["A", "B"])),
            Decision::TakeOver
        );
        // Owner alive: nobody moves, whoever asks.
        for me in ["B", "C"] {
            assert_eq!(
                decide(&devices, &id(me), &id("A"), dead(&[])),
                Decision::OwnerAlive
            );
        }
        // A successor that cannot be judged is not passed over.
        let unknown = |d: &FabricDeviceId| match d.as_str() {
            "A" => Liveness::Dead,
            _ => Liveness::Unknown,
        };
        assert_eq!(
            decide(&devices, &id("C"), &id("A"), unknown),
            Decision::Defer(id("B"))
        );
        assert_eq!(
            decide(&devices, &id("X"), &id("A"), dead(&["A", "B", "C"])),
            Decision::NotASuccessor
        );
    }

    #[test]
    fn the_owner_is_probed_first_and_nobody_after_this_device() {
        let devices = ids(&["A", "B", "C"]);
        let mut probed = Vec::new();
        let decision = decide(&devices, &id("B"), &id("A"), |d| {
            probed.push(d.to_string());
            Liveness::Dead
        });
        assert_eq!(decision, Decision::TakeOver);
        assert_eq!(probed, ["A"]);
    }
}
