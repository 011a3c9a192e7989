//! The clients' keys a device with `--secrets` checks proofs against: read
//! from its keys' folder for the clients of the map it runs, at start and
//! again for every new map (a SIGHUP reload or a new epoch from etcd), so
//! a client the map adds may prove its key at once and one it removes may
//! not. The map says who exists; the keys come only from the folder.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use proto::auth::Key;
use topology::Topology;
use topology::secrets::{Principal, SecretError, read_key};

/// A client's key file exists but cannot be used: the whole map it came
/// with is refused, so keys and map never disagree.
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
}

impl ClientKeys {
    /// Reads the key of every client of `topology` from `dir`. A missing
    /// file leaves that client out (listed in [`ClientKeys::missing`]); a
    /// file that exists but cannot be read, is open to others or is not a
    /// key fails the whole read.
    pub fn read(dir: &Path, topology: &Topology) -> Result<Self, ClientKeyError> {
        let mut read = Self::default();
        for client in &topology.clients {
            let id = client.id.as_str();
            match read_key(dir, Principal::Client(id)) {
                Ok(key) => {
                    read.keys.insert(id.to_owned(), Key::new(key));
                }
                Err(SecretError::Missing { path }) => read.missing.push((id.to_owned(), path)),
                Err(source) => {
                    return Err(ClientKeyError {
                        client: id.to_owned(),
                        source,
                    });
                }
            }
        }
        Ok(read)
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
    fn missing_keys_leave_their_client_out_and_a_bad_one_fails_the_read() {
        let dir = tempfile::tempdir().expect("temp dir");
        write_key(dir.path(), Principal::Client("c1"), &[1; 32]).expect("key");
        let keys = ClientKeys::read(dir.path(), &topology(&["c1", "c2"])).expect("read");
        assert_eq!(keys.keys.len(), 1);
        assert!(keys.keys.contains_key("c1"));
        assert_eq!(keys.missing.len(), 1);
        assert_eq!(keys.missing[0].0, "c2");

        // Created with mode 600 by write_key, then spoiled.
        write_key(dir.path(), Principal::Client("c2"), &[2; 32]).expect("key");
        std::fs::write(dir.path().join(Principal::Client("c2").file_name()), "zz")
            .expect("spoil");
        let err = ClientKeys::read(dir.path(), &topology(&["c1", "c2"])).expect_err("bad key");
        assert_eq!(err.client, "c2");
        assert!(matches!(err.source, SecretError::Malformed { .. }), "{err:?}");
    }

    #[test]
    fn changes_name_the_clients_that_came_and_went() {
        let dir = tempfile::tempdir().expect("temp dir");
        for c in ["c1", "c2", "c3"] {
            write_key(dir.path(), Principal::Client(c), &[7; 32]).expect("key");
        }
        let before = ClientKeys::read(dir.path(), &topology(&["c1", "c2"])).expect("read");
        let after = ClientKeys::read(dir.path(), &topology(&["c2", "c3"])).expect("read");
        assert_eq!(
            after.changes_from(&before.keys),
            (vec!["c3".to_owned()], vec!["c1".to_owned()])
        );
    }
}
