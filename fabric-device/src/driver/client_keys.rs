//! The clients' keys a device with `--secrets` checks proofs against: read
//! from its keys' folder for the clients of the map it runs, at start and
//! again for every new map (a SIGHUP reload or a new epoch from etcd), so
//! a client the map adds may prove its key at once and one it removes may
//! not. The map says who exists; the keys come only from the folder.
//!
//! At start, a key file that exists and cannot be used stops the device.
//! With a new map, that client is left out (it cannot connect, and the log
//! says why, naming the file) and the rest of the map is applied with the
//! keys read for it, in one step: refusing the whole map would leave the
//! device on an old epoch, where the servers answer all its requests
//! STALE_MAP, for one client's file.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proto::auth::Key;
use topology::Topology;
use topology::secrets::{Principal, SecretError, read_key};

/// A client's key file exists but cannot be used (at start).
#[derive(Debug, thiserror::Error)]
#[error("client {client}'s key cannot be used")]
pub struct ClientKeyError {
    /// The client the map names.
    pub client: String,
    /// What is wrong with its file (the error names the file).
    #[source]
    pub source: SecretError,
}

/// The keys of one map's clients.
#[derive(Debug, Default)]
pub struct ClientKeys {
    /// By client id.
    pub keys: HashMap<String, Key>,
    /// Clients of the map without a key file, and the file looked for: they
    /// cannot connect to this device, the others can.
    pub missing: Vec<(String, PathBuf)>,
    /// Clients whose key file exists and cannot be used (unreadable, open
    /// to others, not a key), and why (naming the file).
    pub unusable: Vec<ClientKeyError>,
}

impl ClientKeys {
    /// Reads the key of every client of `topology` from `dir`; a client
    /// whose file is missing or unusable is left out and listed.
    pub fn read(dir: &Path, topology: &Topology) -> Self {
        let mut read = Self::default();
        for client in &topology.clients {
            let id = client.id.as_str();
            match read_key(dir, Principal::Client(id)) {
                Ok(key) => {
                    read.keys.insert(id.to_owned(), Key::new(key));
                }
                Err(SecretError::Missing { path }) => read.missing.push((id.to_owned(), path)),
                Err(source) => read.unusable.push(ClientKeyError {
                    client: id.to_owned(),
                    source,
                }),
            }
        }
        read
    }

    /// The keys, unless a file exists and cannot be used (the first such).
    pub fn all_usable(mut self) -> Result<Self, ClientKeyError> {
        match self.unusable.is_empty() {
            true => Ok(self),
            false => Err(self.unusable.swap_remove(0)),
        }
    }

    /// The clients with a key here and not in `before` (came), and those
    /// with one in `before` and not here (went), each sorted.
    pub fn changes_from(&self, before: &HashMap<String, Key>) -> (Vec<String>, Vec<String>) {
        let now: BTreeSet<&String> = self.keys.keys().collect();
        let was: BTreeSet<&String> = before.keys().collect();
        (
            now.difference(&was).map(|c| (*c).clone()).collect(),
            was.difference(&now).map(|c| (*c).clone()).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use topology::secrets::write_key;

    /// A topology with one server, device F and `clients`, loaded.
    fn topology(clients: &[&str]) -> Topology {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut spec = testkit::FabricSpec::new()
            .server("S", &[("R", "4MiB")])
            .device("F");
        for c in clients {
            spec = spec.client(c);
        }
        let path = spec.write(dir.path(), "t.toml", &mut testkit::Ports::new());
        Topology::load(&path).expect("topology")
    }

    #[test]
    fn missing_and_bad_keys_leave_their_client_out_and_are_listed() {
        let dir = tempfile::tempdir().expect("temp dir");
        write_key(dir.path(), Principal::Client("c1"), &[1; 32]).expect("key");
        let keys = ClientKeys::read(dir.path(), &topology(&["c1", "c2"]));
        assert_eq!(keys.keys.len(), 1);
        assert!(keys.keys.contains_key("c1"));
        assert_eq!(keys.missing.len(), 1);
        assert_eq!(keys.missing[0].0, "c2");

        // Created with mode 600 by write_key, then spoiled.
        write_key(dir.path(), Principal::Client("c2"), &[2; 32]).expect("key");
        std::fs::write(dir.path().join(Principal::Client("c2").file_name()), "zz").expect("spoil");
        let keys = ClientKeys::read(dir.path(), &topology(&["c1", "c2"]));
        assert!(keys.keys.contains_key("c1") && !keys.keys.contains_key("c2"));
        assert!(keys.missing.is_empty());
        let err = keys.all_usable().expect_err("c2's key is not a key");
        assert_eq!(err.client, "c2");
        assert!(
            matches!(err.source, SecretError::Malformed { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn changes_name_the_clients_that_came_and_went() {
        let dir = tempfile::tempdir().expect("temp dir");
        for c in ["c1", "c2", "c3"] {
            write_key(dir.path(), Principal::Client(c), &[7; 32]).expect("key");
        }
        let before = ClientKeys::read(dir.path(), &topology(&["c1", "c2"]));
        let after = ClientKeys::read(dir.path(), &topology(&["c2", "c3"]));
        assert_eq!(
            after.changes_from(&before.keys),
            (vec!["c3".to_owned()], vec!["c1".to_owned()])
        );
    }
}
