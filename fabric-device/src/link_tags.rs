//! Every tag the device gives its own messages on a link to a server, in one
//! place. Tags of forwarded requests count up from 1 with the top bit clear
//! (the core keeps them so); the device's own messages have the top bit
//! set, so a server's answer to one is told apart by its tag alone.

/// Set in every tag of the device's own control messages on a link.
pub const CONTROL_TAG: u64 = 1 << 63;
/// The device's HELLO when a link opens.
pub const LINK_HELLO_TAG: u64 = CONTROL_TAG | 1;
/// The device's MAP_REQUEST when a link opens.
pub const LINK_MAP_TAG: u64 = CONTROL_TAG | 2;
/// The MAP_REQUEST that refreshes a link's region keys (the server refused
/// a request, or a server on verbs is polled).
pub const KEY_REFRESH_TAG: u64 = CONTROL_TAG | 3;
/// The device's MAP_EPOCH on a link.
pub const MAP_EPOCH_TAG: u64 = CONTROL_TAG | 4;
/// The QP_CONNECT that sets up a link's queue pair toward a server on
/// verbs; the driver takes its answer before the core sees it.
pub const QP_CONNECT_TAG: u64 = u64::MAX - 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_tag_is_a_control_tag_and_none_is_used_twice() {
        let tags = [
            LINK_HELLO_TAG,
            LINK_MAP_TAG,
            KEY_REFRESH_TAG,
            MAP_EPOCH_TAG,
            QP_CONNECT_TAG,
        ];
        for (i, tag) in tags.iter().enumerate() {
            assert_ne!(tag & CONTROL_TAG, 0, "tag {tag:#x} lacks the control bit");
            assert!(!tags[i + 1..].contains(tag), "tag {tag:#x} is used twice");
        }
    }
}
