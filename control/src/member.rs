//! What a daemon says about itself in etcd (liveness), and what the
//! operator wants of it (intent).

use std::fmt;

use serde::{Deserialize, Serialize};

/// The kind of daemon a member or intent key is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A pmem-server.
    Server,
    /// A fabric device.
    Device,
}

impl Role {
    /// The word in keys and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Device => "device",
        }
    }

    /// The role a key's word names.
    pub fn parse(word: &str) -> Option<Self> {
        match word {
            "server" => Some(Role::Server),
            "device" => Some(Role::Device),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A live daemon, as its lease-bound key records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Its kind.
    pub role: Role,
    /// Its id in the topology.
    pub name: String,
    /// Where it can be reached (its admin address, or its first listener).
    pub address: String,
    /// This process's incarnation: random per start, so a restarted daemon
    /// under the same name is a new incarnation.
    pub incarnation: u64,
    /// Its process id on its host.
    pub pid: u32,
    /// The map epoch it runs on.
    pub epoch: u64,
}

impl Member {
    /// A member record for this process, with a fresh incarnation.
    pub fn this_process(role: Role, name: &str, address: &str, epoch: u64) -> Self {
        let mut bytes = [0u8; 8];
        // The OS source does not fail on Linux once booted; should it, the
        // clock still tells incarnations apart.
        if getrandom::fill(&mut bytes).is_err() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            bytes = nanos.to_le_bytes();
        }
        Self {
            role,
            name: name.to_owned(),
            address: address.to_owned(),
            incarnation: u64::from_le_bytes(bytes),
            pid: std::process::id(),
            epoch,
        }
    }
}

/// What the operator wants of a server or device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Intent {
    /// In service (the default when no intent is recorded).
    Active,
    /// No new allocations land there; it waits to be emptied.
    Draining,
    /// Taken out of the map.
    Removed,
}

impl Intent {
    /// The word in etcd and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Intent::Active => "active",
            Intent::Draining => "draining",
            Intent::Removed => "removed",
        }
    }

    /// The intent a stored value names.
    pub fn parse(word: &str) -> Option<Self> {
        match word.trim() {
            "active" => Some(Intent::Active),
            "draining" => Some(Intent::Draining),
            "removed" => Some(Intent::Removed),
            _ => None,
        }
    }
}

impl fmt::Display for Intent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incarnations_differ_between_starts() {
        let a = Member::this_process(Role::Server, "A", "127.0.0.1:1", 1);
        let b = Member::this_process(Role::Server, "A", "127.0.0.1:1", 1);
        assert_ne!(a.incarnation, b.incarnation);
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains("\"role\":\"server\""), "{json}");
        assert_eq!(serde_json::from_str::<Member>(&json).unwrap(), a);
    }

    #[test]
    fn words_round_trip() {
        for role in [Role::Server, Role::Device] {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        for intent in [Intent::Active, Intent::Draining, Intent::Removed] {
            assert_eq!(Intent::parse(intent.as_str()), Some(intent));
        }
        assert_eq!(Intent::parse("gone"), None);
    }
}
