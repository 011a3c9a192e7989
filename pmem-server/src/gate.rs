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

use std::collections::{HashMap, HashSet};
use std::path::Path;

use proto::auth::{Key, NONCE_LEN, Proof, Side, Transcript};
use proto::hello::Role;
use topology::grants::Grants;
use topology::secrets::{Principal, SecretError, operators, read_key};
use topology::{Layout, PmemAddr, Topology};

/// The keys of the principals that may connect.
#[derive(Debug, Default)]
pub struct Gatekeeper {
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

impl Gatekeeper {
    /// Loads from `dir` the key of every fabric device of `topology`
    /// (required: devices are this server's peers) and of every client that
    /// has one (clients reach servers through devices).
    pub fn load(dir: &Path, topology: &Topology, layout: &Layout) -> Result<Self, SecretError> {
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
        for device in &topology.fabric_devices {
            let key = read_key(dir, Principal::Device(device.id.as_str()))?;
            keys.insert((Role::FabricDevice, device.id.to_string()), Key::new(key));
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
        Ok(Gatekeeper {
            keys,
            grants,
            numbers,
            devices,
            wired,
        })
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

    /// Fabric device `name`'s number, if the topology has it.
    pub fn device_number(&self, name: &str) -> Option<u32> {
        self.devices.get(name).copied()
    }

    /// Whether device `device` may act for client `client`: one of the
    /// client's RNICs is wired to it.
    pub fn wired(&self, device: u32, client: u32) -> bool {
        self.wired.contains(&(device, client))
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
        /// Its number (position in the topology).
        device: u32,
    },
    /// A client proved its key: its requests are its own.
    ProvenClient {
        /// Its number.
        number: u32,
    },
    /// An operator proved its key: it may rotate region keys, nothing else.
    ProvenOperator,
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
