//! Which exactly-once identities a map names, and how much room the window
//! file keeps for them.
//!
//! An identity is a client number (the client's position in the map) and a
//! lane: lane 0, plus one per RNIC of the client. Each has a slot of about
//! 132 KiB in the window file (4,096 results of 32 bytes and 64 stale marks).
//! The file is sized at start; a map that wires a client's RNIC to an added
//! device, or adds a client, names identities the starting map did not. So
//! the file keeps room beyond the starting map: one more lane per client
//! and [`SPARE_IDENTITIES`] more. A slot no identity has used is a hole in
//! the file: it takes no disk or PMEM, and checking it at start reads one
//! page. Identities beyond the room are refused (`window_full`) until the
//! server restarts, which grows the file to the map it starts on.

use topology::Topology;

/// Identities the window file keeps room for beyond one more lane per
/// client of the starting map: clients a map adds.
pub const SPARE_IDENTITIES: usize = 64;

/// The highest lane of each client number of `topology`: its number of
/// RNICs.
pub fn lanes_of(topology: &Topology) -> Vec<u8> {
    topology
        .clients
        .iter()
        .map(|c| u8::try_from(c.rnics.len()).unwrap_or(u8::MAX))
        .collect()
}

/// How many identities `lanes` names (lane 0 and one per RNIC).
pub fn identities(lanes: &[u8]) -> usize {
    lanes.iter().map(|&l| usize::from(l) + 1).sum()
}

/// The slots a window file is sized for when the server starts on a map
/// with `lanes`: its identities, one more lane per client, and
/// [`SPARE_IDENTITIES`].
pub fn window_slots(lanes: &[u8]) -> usize {
    identities(lanes) + lanes.len() + SPARE_IDENTITIES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_for_one_more_lane_per_client_and_the_spare() {
        // c0 with two RNICs, c1 with none.
        let lanes = [2, 0];
        assert_eq!(identities(&lanes), 4);
        assert_eq!(window_slots(&lanes), 4 + 2 + SPARE_IDENTITIES);
        assert_eq!(window_slots(&[]), SPARE_IDENTITIES);
    }
}
