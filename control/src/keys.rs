//! Where everything lives in etcd: one prefix per pool.
//!
//! ```text
//! /pmem-fabric/<pool>/map                   the cluster map (JSON: epoch, topology, replica states)
//! /pmem-fabric/<pool>/members/<role>/<name> a live daemon (JSON, bound to its lease)
//! /pmem-fabric/<pool>/intent/<role>/<name>  the operator's intent: active, draining, removed
//! /pmem-fabric/<pool>/drain/<server>/single-copy  regions with one copy when its drain began (until it ends)
//! ```
//!
//! `<role>` is `server` or `device`; names are the topology's ids.

use crate::member::Role;

/// The root of every pool's keys.
pub const ROOT: &str = "/pmem-fabric/";

/// The keys of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The keys of pool `pool` (a topology's `[pool] name`, which cannot
    /// hold a `/`).
    pub fn of(pool: &str) -> Self {
        Self {
            prefix: format!("{ROOT}{pool}/"),
        }
    }

    /// Everything of the pool.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The cluster map.
    pub fn map(&self) -> String {
        format!("{}map", self.prefix)
    }

    /// Where live members of every role are.
    pub fn members(&self) -> String {
        format!("{}members/", self.prefix)
    }

    /// The liveness key of `name` in `role`.
    pub fn member(&self, role: Role, name: &str) -> String {
        format!("{}{}/{name}", self.members(), role.as_str())
    }

    /// Where the operator's intents are.
    pub fn intents(&self) -> String {
        format!("{}intent/", self.prefix)
    }

    /// The operator's intent for `name` in `role`.
    pub fn intent(&self, role: Role, name: &str) -> String {
        format!("{}{}/{name}", self.intents(), role.as_str())
    }

    /// The regions that had a single copy, on `server`, when its drain
    /// began (one id a line): they keep one copy after the drain.
    pub fn drain_single_copies(&self, server: &str) -> String {
        format!("{}drain/{server}/single-copy", self.prefix)
    }

    /// The role and name a member or intent key names, if it is one
    /// (`under` is [`Keys::members`] or [`Keys::intents`]); malformed keys
    /// give `None`.
    pub fn parse_under<'k>(&self, under: &str, key: &'k str) -> Option<(Role, &'k str)> {
        let rest = key.strip_prefix(under)?;
        let (role, name) = rest.split_once('/')?;
        if name.is_empty() || name.contains('/') {
            return None;
        }
        Some((Role::parse(role)?, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_parsing_agree() {
        let k = Keys::of("pool1");
        assert_eq!(k.map(), "/pmem-fabric/pool1/map");
        let m = k.member(Role::Server, "A");
        assert_eq!(m, "/pmem-fabric/pool1/members/server/A");
        assert_eq!(k.parse_under(&k.members(), &m), Some((Role::Server, "A")));
        let i = k.intent(Role::Device, "F1");
        assert_eq!(k.parse_under(&k.intents(), &i), Some((Role::Device, "F1")));
        for bad in [
            "/pmem-fabric/pool1/members/router/A",
            "/pmem-fabric/pool1/members/server/",
            "/pmem-fabric/pool1/members/server/A/b",
            "/pmem-fabric/other/members/server/A",
        ] {
            assert_eq!(k.parse_under(&k.members(), bad), None, "{bad}");
        }
    }
}
