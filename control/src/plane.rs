//! The etcd client: reading and changing the cluster map, registering a
//! daemon's liveness, and reading members and intents.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchStream,
};
use tokio::task::JoinHandle;

use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::keys::Keys;
use crate::map::{ClusterMap, VersionedMap};
use crate::member::{Intent, Member, Role};

/// How long connecting to one endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection to the control plane of one pool.
#[derive(Clone)]
pub struct ControlPlane {
    client: Client,
    keys: Keys,
    endpoints: Endpoints,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("endpoints", &self.endpoints.to_string())
            .field("prefix", &self.keys.prefix())
            .finish()
    }
}

fn etcd(what: &'static str) -> impl FnOnce(etcd_client::Error) -> ControlError {
    move |source| ControlError::Etcd { what, source }
}

impl ControlPlane {
    /// Connects to `endpoints` for pool `pool`, and checks that one of
    /// them answers (a read of the map's key), so an unreachable etcd is
    /// said here, naming the endpoints tried.
    pub async fn connect(endpoints: &Endpoints, pool: &str) -> Result<Self, ControlError> {
        if pool.is_empty() || pool.contains('/') {
            return Err(ControlError::BadPoolName {
                name: pool.to_owned(),
            });
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        let unreachable = |source| ControlError::Unreachable {
            endpoints: endpoints.clone(),
            source,
        };
        let mut client = Client::connect(endpoints.urls(), Some(options))
            .await
            .map_err(unreachable)?;
        let keys = Keys::of(pool);
        client.get(keys.map(), None).await.map_err(unreachable)?;
        Ok(Self {
            client,
            keys,
            endpoints: endpoints.clone(),
        })
    }

    /// The pool's key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The endpoints this connection uses.
    pub fn endpoints(&self) -> &Endpoints {
        &self.endpoints
    }

    /// Loads the first map (epoch 1) from `topology` (TOML), which must be
    /// valid; refused if the pool already has one.
    pub async fn init(&mut self, topology: &str) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        let map = ClusterMap {
            epoch: 1,
            topology: topology.to_owned(),
        };
        map.topology_at(&key)?;
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), map.to_json(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self.client.txn(txn).await.map_err(etcd("init"))?;
        if !response.succeeded() {
            let current = self.current_in(&response)?;
            return Err(ControlError::AlreadyInitialized {
                key,
                epoch: current.map.epoch,
            });
        }
        let revision = response.header().map_or(0, |h| h.revision());
        Ok(VersionedMap { map, revision })
    }

    /// The map as etcd holds it now.
    pub async fn read_map(&mut self) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        let response = self
            .client
            .get(key.clone(), None)
            .await
            .map_err(etcd("read of the map"))?;
        let kv = response
            .kvs()
            .first()
            .ok_or(ControlError::NoMap { key: key.clone() })?;
        Ok(VersionedMap {
            map: ClusterMap::from_json(&key, kv.value())?,
            revision: kv.mod_revision(),
        })
    }

    /// The map's key as etcd holds it now, unvalidated: its value and
    /// `mod_revision` (`None` when there is no map), and the store's
    /// revision at the read (what a watch continues from).
    pub async fn fetch_map(&mut self) -> Result<(Option<(Vec<u8>, i64)>, i64), ControlError> {
        let response = self
            .client
            .get(self.keys.map(), None)
            .await
            .map_err(etcd("read of the map"))?;
        let revision = response.header().map_or(0, |h| h.revision());
        let kv = response
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision()));
        Ok((kv, revision))
    }

    /// Watches the map's key from revision `from` (inclusive), with
    /// progress notifications so a quiet watch still learns the store's
    /// revision.
    pub async fn watch_map(&mut self, from: i64) -> Result<WatchStream, ControlError> {
        let options = WatchOptions::new()
            .with_start_revision(from)
            .with_progress_notify();
        self.client
            .watch(self.keys.map(), Some(options))
            .await
            .map_err(etcd("watch of the map"))
    }

    /// Replaces the map read as `based_on` by `topology` (TOML, which must
    /// be valid) at the next epoch, in one transaction that fails with
    /// [`ControlError::Conflict`] if anyone changed the map since.
    pub async fn change_map(
        &mut self,
        based_on: &VersionedMap,
        topology: &str,
    ) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        let map = ClusterMap {
            epoch: based_on.map.epoch + 1,
            topology: topology.to_owned(),
        };
        map.topology_at(&key)?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                based_on.revision,
            )])
            .and_then([TxnOp::put(key.clone(), map.to_json(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self
            .client
            .txn(txn)
            .await
            .map_err(etcd("change of the map"))?;
        if !response.succeeded() {
            let current = self.current_in(&response)?;
            return Err(ControlError::Conflict {
                expected: based_on.map.epoch,
                current: current.map.epoch,
            });
        }
        let revision = response.header().map_or(0, |h| h.revision());
        Ok(VersionedMap { map, revision })
    }

    /// The map a failed transaction's `or_else` read.
    fn current_in(
        &self,
        response: &etcd_client::TxnResponse,
    ) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        for op in response.op_responses() {
            if let TxnOpResponse::Get(get) = op
                && let Some(kv) = get.kvs().first()
            {
                return Ok(VersionedMap {
                    map: ClusterMap::from_json(&key, kv.value())?,
                    revision: kv.mod_revision(),
                });
            }
        }
        Err(ControlError::NoMap { key })
    }

    /// Registers `member` under a lease of `ttl` seconds and keeps the
    /// lease alive from a task on the current tokio runtime until the
    /// returned [`Liveness`] is dropped or revoked.
    pub async fn register(&mut self, member: &Member, ttl: i64) -> Result<Liveness, ControlError> {
        let lease = self
            .client
            .lease_grant(ttl, None)
            .await
            .map_err(etcd("lease grant"))?
            .id();
        let value = serde_json::to_string(member).unwrap_or_default();
        let key = self.keys.member(member.role, &member.name);
        self.client
            .put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(etcd("registration"))?;
        let (mut keeper, mut stream) = self
            .client
            .lease_keep_alive(lease)
            .await
            .map_err(etcd("lease keep-alive"))?;
        let period = Duration::from_secs((ttl as u64 / 3).max(1));
        let task = tokio::spawn(async move {
            loop {
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match stream.message().await {
                    // A TTL of 0: the lease is gone.
                    Ok(Some(answer)) if answer.ttl() > 0 => {}
                    _ => break,
                }
                tokio::time::sleep(period).await;
            }
        });
        Ok(Liveness {
            client: self.client.clone(),
            key,
            lease,
            task,
        })
    }

    /// Every live member; records that do not parse are skipped with a
    /// warning.
    pub async fn members(&mut self) -> Result<Vec<Member>, ControlError> {
        let under = self.keys.members();
        let response = self
            .client
            .get(under.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(etcd("read of the members"))?;
        let mut members = Vec::new();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            match serde_json::from_slice::<Member>(kv.value()) {
                Ok(member) if self.keys.parse_under(&under, &key).is_some() => {
                    members.push(member);
                }
                _ => tracing::warn!("ignoring malformed member record at etcd key {key}"),
            }
        }
        members.sort_by(|a, b| (a.role, &a.name).cmp(&(b.role, &b.name)));
        Ok(members)
    }

    /// Records the operator's intent for `name` in `role`.
    pub async fn set_intent(
        &mut self,
        role: Role,
        name: &str,
        intent: Intent,
    ) -> Result<(), ControlError> {
        self.client
            .put(self.keys.intent(role, name), intent.as_str(), None)
            .await
            .map_err(etcd("write of an intent"))?;
        Ok(())
    }

    /// Every recorded intent; malformed records are skipped with a warning.
    pub async fn intents(&mut self) -> Result<Vec<(Role, String, Intent)>, ControlError> {
        let under = self.keys.intents();
        let response = self
            .client
            .get(under.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(etcd("read of the intents"))?;
        let mut intents = Vec::new();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key());
            let parsed = self
                .keys
                .parse_under(&under, &key)
                .and_then(|(role, name)| {
                    let intent = Intent::parse(std::str::from_utf8(kv.value()).ok()?)?;
                    Some((role, name.to_owned(), intent))
                });
            match parsed {
                Some(entry) => intents.push(entry),
                None => tracing::warn!("ignoring malformed intent at etcd key {key}"),
            }
        }
        intents.sort();
        Ok(intents)
    }
}

/// A registered member's lease, kept alive until this is dropped (the key
/// then expires with the lease) or [`Liveness::revoke`]d (it goes at once).
pub struct Liveness {
    client: Client,
    key: String,
    lease: i64,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Liveness")
            .field("lease", &self.lease)
            .finish()
    }
}

impl Liveness {
    /// The lease's id.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    /// Whether the lease is still being kept alive.
    pub fn is_alive(&self) -> bool {
        !self.task.is_finished()
    }

    /// Writes `member` (the same daemon, with news such as the epoch it
    /// runs) over its record, under the same lease.
    pub async fn rewrite(&mut self, member: &Member) -> Result<(), ControlError> {
        let value = serde_json::to_string(member).unwrap_or_default();
        self.client
            .put(
                self.key.clone(),
                value,
                Some(PutOptions::new().with_lease(self.lease)),
            )
            .await
            .map_err(etcd("update of the liveness record"))?;
        Ok(())
    }

    /// Ends the lease now: the member's key goes with it.
    pub async fn revoke(mut self) -> Result<(), ControlError> {
        self.task.abort();
        self.client
            .lease_revoke(self.lease)
            .await
            .map_err(etcd("lease revoke"))?;
        Ok(())
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.task.abort();
    }
}
