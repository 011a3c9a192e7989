//! Who may talk to this server, and for whom: with `--secrets`, every
//! connection must prove it holds the key of the fabric device (or client)
//! it names in HELLO before anything else is answered (`proto::auth`), and
//! every request is held to the grants (allow-list) of the client it is
//! for: the one a device says it forwards for (ON_BEHALF), or the client
//! itself on a direct connection. A device may act only for the clients
//! the topology wires to it (an RNIC of the client names the device), and
//! an exactly-once identity is used only by the client it numbers (see
//! `Executor::authorize`). Operators (`operator.<name>.key`) may
//! rotate region keys and nothing else. Without, the server answers whoever
//! reaches its data port, as before.
//!
//! The map says who exists, the keys' folder holds their keys: a server on
//! etcd builds its gatekeeper again from each new map (`Gatekeeper::follow`),
//! so a fabric device added to the map may connect at once and one removed
//! from it no longer may (its open connections are refused and closed).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use proto::auth::{Key, NONCE_LEN, Proof, Side, Transcript};
use proto::hello::Role;
use topology::grants::Grants;
use topology::secrets::{Principal, SecretError, operators, read_key};
use topology::{Layout, PmemAddr, Topology};

/// The keys of the principals that may connect.
#[derive(Debug, Default)]
pub struct Gatekeeper {
    /// The folder the keys were read from.
    dir: PathBuf,
    /// The map epoch these principals are of (0: the map the server
    /// started on).
    epoch: u64,
    keys: HashMap<(Role, String), Key>,
    /// Each client's grants, by client number (position in the topology).
    grants: Vec<Grants>,
    /// Client numbers by id.
    numbers: HashMap<String, u32>,
    /// Fabric device numbers (positions in the topology) by id.
    devices: HashMap<String, u32>,
    /// (device number, client number) for every client RNIC wired to a
    /// device: whom each device may act for.
    wired: HashSet<(u32, u32)>,
}

/// A gatekeeper built from a new map, and the fabric devices of that map
/// whose key could not be read (they cannot connect until it can).
#[derive(Debug)]
pub struct Followed {
    /// The new gatekeeper.
    pub gate: Gatekeeper,
    /// Devices left out, each with why.
    pub unreadable: Vec<(String, SecretError)>,
}

/// What following a new map did to the gatekeeper, for its log lines.
#[derive(Debug)]
pub struct FollowedPrincipals {
    /// The keys' folder.
    pub dir: PathBuf,
    /// The fabric devices that could connect before.
    pub before: BTreeSet<String>,
    /// Those that may connect now.
    pub devices: BTreeSet<String>,
    /// Devices of the new map whose key could not be read, with why.
    pub unreadable: Vec<(String, SecretError)>,
}

impl FollowedPrincipals {
    /// Devices that may connect now and could not before.
    pub fn added(&self) -> impl Iterator<Item = &str> {
        self.devices.difference(&self.before).map(String::as_str)
    }

    /// Devices that could connect before and may not now.
    pub fn revoked(&self) -> impl Iterator<Item = &str> {
        self.before.difference(&self.devices).map(String::as_str)
    }
}

impl Gatekeeper {
    /// Loads from `dir` the key of every fabric device of `topology`
    /// (required: devices are this server's peers) and of every client that
    /// has one (clients reach servers through devices).
    pub fn load(dir: &Path, topology: &Topology, layout: &Layout) -> Result<Self, SecretError> {
        let (gate, unreadable) = Self::read(dir, topology, layout)?;
        match unreadable.into_iter().next() {
            Some((_, error)) => Err(error),
            None => Ok(gate),
        }
    }

    /// The gatekeeper of a new map of the same fabric, at `epoch`: the
    /// principals it names, with their keys read again from this
    /// gatekeeper's folder. A device whose key cannot be read is left out
    /// (it cannot connect) and reported, rather than refusing the whole
    /// map: the others keep working. Fails only when a client's or
    /// operator's key, or the folder itself, cannot be read.
    pub fn follow(
        &self,
        topology: &Topology,
        layout: &Layout,
        epoch: u64,
    ) -> Result<Followed, SecretError> {
        let (mut gate, unreadable) = Self::read(&self.dir, topology, layout)?;
        gate.epoch = epoch;
        Ok(Followed { gate, unreadable })
    }

    /// The map epoch these principals are of (0: the map the server
    /// started on).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The fabric devices that may connect.
    pub fn devices(&self) -> BTreeSet<&str> {
        self.keys
            .keys()
            .filter(|(role, _)| *role == Role::FabricDevice)
            .map(|(_, name)| name.as_str())
            .collect()
    }

    /// The folder the keys are read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the keys of `topology`'s principals from `dir`; devices whose
    /// key cannot be read come back beside the gatekeeper, left out of it.
    fn read(
        dir: &Path,
        topology: &Topology,
        layout: &Layout,
    ) -> Result<(Self, Vec<(String, SecretError)>), SecretError> {
        let grants = topology
            .clients
            .iter()
            .map(|c| Grants::of(layout, c))
            .collect();
        let numbers = topology
            .clients
            .iter()
            .enumerate()
            .map(|(n, c)| (c.id.to_string(), u32::try_from(n).unwrap_or(u32::MAX)))
            .collect();
        let number_of = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let devices: HashMap<String, u32> = topology
            .fabric_devices
            .iter()
            .enumerate()
            .map(|(n, d)| (d.id.to_string(), number_of(n)))
            .collect();
        let wired = topology
            .clients
            .iter()
            .enumerate()
            .flat_map(|(client, c)| {
                let devices = &devices;
                c.rnics.iter().filter_map(move |rnic| {
                    let device = devices.get(rnic.fabric_device.as_str())?;
                    Some((*device, number_of(client)))
                })
            })
            .collect();
        let mut keys = HashMap::new();
        let mut unreadable = Vec::new();
        for device in &topology.fabric_devices {
            match read_key(dir, Principal::Device(device.id.as_str())) {
                Ok(key) => {
                    keys.insert((Role::FabricDevice, device.id.to_string()), Key::new(key));
                }
                Err(e) => unreadable.push((device.id.to_string(), e)),
            }
        }
        for client in &topology.clients {
            match read_key(dir, Principal::Client(client.id.as_str())) {
                Ok(key) => {
                    keys.insert((Role::Client, client.id.to_string()), Key::new(key));
                }
                Err(SecretError::Missing { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        for operator in operators(dir)? {
            let key = read_key(dir, Principal::Operator(&operator))?;
            keys.insert((Role::Admin, operator), Key::new(key));
        }
        let gate = Gatekeeper {
            dir: dir.to_path_buf(),
            epoch: 0,
            keys,
            grants,
            numbers,
            devices,
            wired,
        };
        Ok((gate, unreadable))
    }

    /// Whether client `number`'s grants reach any of `[addr, addr + len)`:
    /// then it is given the region key of a region there.
    pub fn reaches(&self, number: u32, addr: PmemAddr, len: u64) -> bool {
        self.grants
            .get(number as usize)
            .is_some_and(|grants| grants.overlaps(addr, len))
    }

    /// Client `name`'s number, if the topology has it.
    pub fn client_number(&self, name: &str) -> Option<u32> {
        self.numbers.get(name).copied()
    }

    /// Whether fabric device `name` may connect: the map names it and its
    /// key was read.
    pub fn admits_device(&self, name: &str) -> bool {
        self.keys
            .contains_key(&(Role::FabricDevice, name.to_owned()))
    }

    /// Whether device `device` may act for client `client`: one of the
    /// client's RNICs is wired to it.
    pub fn wired(&self, device: &str, client: u32) -> bool {
        self.devices
            .get(device)
            .is_some_and(|number| self.wired.contains(&(*number, client)))
    }

    /// Why client `number` may not touch `[addr, addr + len)` (or change
    /// it, for a `write`), if it may not.
    pub fn denies(
        &self,
        number: u32,
        addr: PmemAddr,
        len: u64,
        write: bool,
    ) -> Option<&'static str> {
        match self.grants.get(number as usize) {
            None => Some("unknown_client"),
            Some(grants) if !grants.allows(addr, len, write) => Some("not_granted"),
            Some(_) => None,
        }
    }

    /// How many principals may connect.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no principal may connect.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The key of `name` in `role`, if it may connect.
    pub fn key(&self, role: Role, name: &str) -> Option<&Key> {
        self.keys.get(&(role, name.to_owned()))
    }
}

/// Where one connection stands with the gate.
#[derive(Debug)]
pub enum Session {
    /// No authentication asked for: everything is answered.
    Open,
    /// HELLO is due.
    Hello,
    /// The challenge went out.
    Challenged {
        /// The role the peer said.
        role: Role,
        /// The name the peer said.
        name: String,
        /// Our nonce.
        nonce: [u8; NONCE_LEN],
    },
    /// A fabric device proved its key: it says whom each request is for,
    /// among the clients wired to it.
    ProvenDevice {
        /// Its id (by name, not position: a new map may renumber devices).
        device: String,
    },
    /// A client proved its key: its requests are its own.
    ProvenClient {
        /// Its number.
        number: u32,
    },
    /// An operator proved its key: it may rotate region keys, nothing else.
    ProvenOperator,
    /// A fabric device proven before that the map at `epoch` no longer
    /// names: every frame but a PING is answered STALE_MAP with that epoch
    /// (nothing runs, no key is given; its client moves to the new map
    /// and another path).
    Revoked {
        /// The epoch of the map that removed it.
        epoch: u64,
    },
}

impl Session {
    /// Whether the peer may set up RDMA queue pairs to this server's
    /// memory: a fabric device that proved its key, or anyone when the
    /// server asks for no keys.
    pub fn may_set_up_queue_pairs(&self) -> bool {
        matches!(self, Session::Open | Session::ProvenDevice { .. })
    }

    /// Whether requests may be answered.
    pub fn admits(&self) -> bool {
        matches!(
            self,
            Session::Open
                | Session::ProvenDevice { .. }
                | Session::ProvenClient { .. }
                | Session::ProvenOperator
        )
    }
}

/// Checks the peer's proof; on success returns ours.
pub fn answer_proof(
    key: &Key,
    role: Role,
    name: &str,
    server: &str,
    nonce: [u8; NONCE_LEN],
    proof: &Proof,
) -> Option<Proof> {
    let transcript = Transcript {
        role,
        principal: name,
        listener: server,
        listener_nonce: nonce,
        connector_nonce: proof.nonce,
    };
    key.verify(Side::Connector, &transcript, &proof.mac)
        .then(|| Proof {
            nonce: [0; NONCE_LEN],
            mac: key.prove(Side::Listener, &transcript),
        })
}

#[cfg(test)]
mod tests {
    use topology::EnvOverrides;
    use topology::secrets::write_key;

    use super::*;

    /// Server S, devices F and G, client c wired to both; and the keys of
    /// F and G in a folder.
    fn fabric(dir: &Path) -> (String, PathBuf) {
        let path = testkit::FabricSpec::new()
            .server("S", &[("R1", "4MiB")])
            .device("F")
            .device("G")
            .client("c")
            .write(dir, "fabric.toml", &mut testkit::Ports::new());
        let keys = dir.join("keys");
        std::fs::create_dir_all(&keys).expect("keys folder");
        write_key(&keys, Principal::Device("F"), &[1; 32]).expect("F's key");
        write_key(&keys, Principal::Device("G"), &[2; 32]).expect("G's key");
        (std::fs::read_to_string(path).expect("topology"), keys)
    }

    fn parse(text: &str) -> (Topology, Layout) {
        let topology = Topology::from_toml_str("map", text, &EnvOverrides::None).expect("parses");
        let layout = Layout::new(&topology).expect("lays out");
        (topology, layout)
    }

    #[test]
    fn a_new_map_admits_added_devices_and_drops_removed_ones_by_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (whole, keys) = fabric(dir.path());
        let without_g = control::edit::remove_device(&whole, "G").expect("edit");
        let (first, layout) = parse(&without_g.topology);
        let gate = Gatekeeper::load(&keys, &first, &layout).expect("loads");
        assert!(gate.admits_device("F") && !gate.admits_device("G"));

        let (both, layout) = parse(&whole);
        let followed = gate.follow(&both, &layout, 2).expect("follows");
        assert!(followed.unreadable.is_empty());
        let gate = followed.gate;
        assert!(gate.admits_device("F") && gate.admits_device("G"));
        assert!(gate.wired("G", 0), "c is wired to G");

        // Without F, G is the first device: it keeps acting for c (known
        // by name, not by position); F is gone.
        let without_f = control::edit::remove_device(&whole, "F").expect("edit");
        let (last, layout) = parse(&without_f.topology);
        let gate = gate.follow(&last, &layout, 3).expect("follows").gate;
        assert!(!gate.admits_device("F") && !gate.wired("F", 0));
        assert!(gate.admits_device("G") && gate.wired("G", 0));
        assert_eq!(gate.devices(), BTreeSet::from(["G"]));
    }

    #[test]
    fn a_device_whose_key_is_missing_is_left_out_of_a_new_map_not_the_others() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (whole, keys) = fabric(dir.path());
        let (topology, layout) = parse(&whole);
        let gate = Gatekeeper::load(&keys, &topology, &layout).expect("loads");
        std::fs::remove_file(keys.join(Principal::Device("G").file_name())).expect("rm");
        let followed = gate.follow(&topology, &layout, 2).expect("follows");
        assert!(followed.gate.admits_device("F"));
        assert!(!followed.gate.admits_device("G"));
        assert_eq!(followed.unreadable.len(), 1);
        assert_eq!(followed.unreadable[0].0, "G");
        assert!(matches!(
            followed.unreadable[0].1,
            SecretError::Missing { .. }
        ));
        // At start, the same missing key stops the server.
        assert!(matches!(
            Gatekeeper::load(&keys, &topology, &layout),
            Err(SecretError::Missing { .. })
        ));
    }
}
