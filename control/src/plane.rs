//! The etcd client: reading and changing the cluster map, registering a
//! daemon's liveness, and reading members and intents.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchStream,
};
use tokio::task::JoinHandle;

use crate::credentials::Credentials;
use crate::edit::mark_replica;
use crate::endpoints::Endpoints;
use crate::error::ControlError;
use crate::keys::Keys;
use crate::map::{ClusterMap, VersionedMap};
use crate::member::{Intent, Member, Role};
use crate::replica_state::ReplicaState;

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
    /// The etcd user this connection authenticated as, if any.
    user: Option<String>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("endpoints", &self.endpoints.to_string())
            .field("prefix", &self.keys.prefix())
            .field("user", &self.user)
            .finish()
    }
}

/// What etcd's answer `source` to a `what` of `key` by `user` means: no
/// credentials where etcd wants them, a wrong password, a permission etcd
/// refused, an unreachable etcd, or another failure.
fn classify(
    endpoints: &Endpoints,
    user: Option<&str>,
    what: &'static str,
    key: String,
    source: etcd_client::Error,
) -> ControlError {
    let message = match &source {
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
            return ControlError::Unreachable {
                endpoints: endpoints.clone(),
                source,
            };
        }
        other => other.to_string(),
    };
    let user_name = || user.unwrap_or("(none)").to_owned();
    if message.contains("user name is empty") || message.contains("user name not found") {
        ControlError::NeedsCredentials {
            endpoints: endpoints.clone(),
        }
    } else if message.contains("authentication failed") {
        ControlError::AuthFailed {
            endpoints: endpoints.clone(),
            user: user_name(),
            source,
        }
    } else if message.contains("authentication is not enabled") {
        ControlError::AuthNotEnabled {
            endpoints: endpoints.clone(),
            user: user_name(),
        }
    } else if message.contains("permission denied") {
        ControlError::PermissionDenied {
            user: user_name(),
            what,
            key,
        }
    } else {
        ControlError::Etcd { what, source }
    }
}

/// Attempts at most of one edit of the map ([`ControlPlane::edit_map`])
/// while the map keeps changing elsewhere under it.
const EDIT_ATTEMPTS: usize = 8;

/// How an edit of the map ([`ControlPlane::edit_map`]) ended.
#[derive(Debug)]
pub(crate) enum Edited<W, S> {
    /// Written: the map as written, with what the edit returned with it.
    Written(VersionedMap, W),
    /// The edit stopped, for this reason; nothing was written.
    Stopped(S),
}

impl ControlPlane {
    /// Connects to `endpoints` for pool `pool`, as the etcd user of
    /// `credentials` when given (required once etcd has authentication
    /// on), and checks that one of them answers (a read of the map's key),
    /// so an unreachable etcd is said here, naming the endpoints tried,
    /// and so are missing or wrong credentials.
    pub async fn connect(
        endpoints: &Endpoints,
        pool: &str,
        credentials: Option<&Credentials>,
    ) -> Result<Self, ControlError> {
        if pool.is_empty() || pool.contains('/') {
            return Err(ControlError::BadPoolName {
                name: pool.to_owned(),
            });
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_timeout(REQUEST_TIMEOUT);
        if let Some(creds) = credentials {
            // A token lost with an etcd restart is fetched again.
            options = options
                .with_user(creds.user(), creds.password())
                .with_auto_token_refresh(true);
        }
        let user = credentials.map(|c| c.user().to_owned());
        let keys = Keys::of(pool);
        // At connect, any other failure means no etcd answered.
        let refused =
            |source| match classify(endpoints, user.as_deref(), "read", keys.map(), source) {
                ControlError::Etcd { source, .. } => ControlError::Unreachable {
                    endpoints: endpoints.clone(),
                    source,
                },
                other => other,
            };
        let mut client = Client::connect(endpoints.urls(), Some(options))
            .await
            .map_err(refused)?;
        client.get(keys.map(), None).await.map_err(refused)?;
        Ok(Self {
            client,
            keys,
            endpoints: endpoints.clone(),
            user,
        })
    }

    /// The etcd user this connection authenticated as, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Turns an etcd failure of `what` on `key` into the error to report:
    /// missing credentials and refused permissions are said as such.
    fn failed(
        &self,
        what: &'static str,
        key: String,
    ) -> impl FnOnce(etcd_client::Error) -> ControlError + 'static {
        let endpoints = self.endpoints.clone();
        let user = self.user.clone();
        move |source| classify(&endpoints, user.as_deref(), what, key, source)
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
        let map = ClusterMap::new(1, topology);
        let absent = Compare::version(key.clone(), CompareOp::Equal, 0);
        self.put_map_if(absent, map, "init of the map")
            .await?
            .map_err(|current| ControlError::AlreadyInitialized {
                key,
                epoch: current.map.epoch,
            })
    }

    /// The map as etcd holds it now.
    pub async fn read_map(&mut self) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        let response = self
            .client
            .get(key.clone(), None)
            .await
            .map_err(self.failed("read of the map", key.clone()))?;
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
        let key = self.keys.map();
        let response = self
            .client
            .get(key.clone(), None)
            .await
            .map_err(self.failed("read of the map", key))?;
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
        let key = self.keys.map();
        self.client
            .watch(key.clone(), Some(options))
            .await
            .map_err(self.failed("watch of the map", key))
    }

    /// Replaces the map read as `based_on` by `topology` (TOML, which must
    /// be valid) at the next epoch, in one transaction that fails with
    /// [`ControlError::Conflict`] if anyone changed the map since. Copies
    /// of replicated regions keep their states; new copies of existing
    /// regions start syncing ([`ClusterMap::next`]).
    pub async fn change_map(
        &mut self,
        based_on: &VersionedMap,
        topology: &str,
    ) -> Result<VersionedMap, ControlError> {
        let (map, _) = based_on.map.next(&self.keys.map(), topology)?;
        self.replace_map(based_on, map).await
    }

    /// Writes `map` (whose epoch must be the next after `based_on`'s) over
    /// the map read as `based_on`, in one transaction that fails with
    /// [`ControlError::Conflict`] if anyone changed the map since: the
    /// way replica-state edits ([`crate::edit::mark_replica`]) are written.
    pub async fn replace_map(
        &mut self,
        based_on: &VersionedMap,
        map: ClusterMap,
    ) -> Result<VersionedMap, ControlError> {
        let key = self.keys.map();
        if map.epoch != based_on.map.epoch + 1 {
            return Err(ControlError::EpochNotNext {
                based_on: based_on.map.epoch,
                epoch: map.epoch,
            });
        }
        let unchanged = Compare::mod_revision(key, CompareOp::Equal, based_on.revision);
        self.put_map_if(unchanged, map, "change of the map")
            .await?
            .map_err(|current| ControlError::Conflict {
                expected: based_on.map.epoch,
                current: current.map.epoch,
            })
    }

    /// Marks the copy of `region` on `server` `state`, if the region's
    /// replica set is still at `expected_version` (the version its caller
    /// decided on): one transaction that bumps the set's version and the
    /// map's epoch ([`crate::edit::mark_replica`] decides what may change).
    /// A change of the map elsewhere meanwhile (another region's copies)
    /// is read again and the mark retried; a change of this region's set
    /// is [`ControlError::ReplicaSetMoved`]. Returns the new epoch.
    ///
    /// This is what a fabric device calls when it takes a dead copy out
    /// of a set; its etcd user may write the map for this
    /// ([`crate::access`]).
    pub async fn mark_copy(
        &mut self,
        region: &str,
        server: &str,
        state: ReplicaState,
        expected_version: u64,
    ) -> Result<u64, ControlError> {
        let edited = self
            .edit_map(|map| {
                if let Some(record) = map.replica_set(region)
                    && record.version != expected_version
                {
                    return Err(ControlError::ReplicaSetMoved {
                        region: region.to_owned(),
                        expected: expected_version,
                        current: record.version,
                    });
                }
                let marked = mark_replica(map, region, server, state).map_err(|source| {
                    ControlError::MarkRefused {
                        region: region.to_owned(),
                        server: server.to_owned(),
                        state,
                        source: Box::new(source),
                    }
                })?;
                Ok((marked.map, marked.note))
            })
            .await?;
        match edited {
            Edited::Written(written, note) => {
                tracing::info!("{note}");
                Ok(written.map.epoch)
            }
            Edited::Stopped(refused) => Err(refused),
        }
    }

    /// One edit of the map, in one transaction against the revision it was
    /// decided on: reads the map and asks `decide` for the new map (and a
    /// value to return with it), or for why it stops there (`Err`, nothing
    /// written). A change of the map elsewhere meanwhile is read again and
    /// decided anew, at most [`EDIT_ATTEMPTS`] times; reading or writing
    /// failing otherwise is the error.
    pub(crate) async fn edit_map<W, S>(
        &mut self,
        mut decide: impl FnMut(&ClusterMap) -> Result<(ClusterMap, W), S>,
    ) -> Result<Edited<W, S>, ControlError> {
        let mut last = None;
        for _ in 0..EDIT_ATTEMPTS {
            let read = self.read_map().await?;
            let (map, with) = match decide(&read.map) {
                Ok(edit) => edit,
                Err(stop) => return Ok(Edited::Stopped(stop)),
            };
            match self.replace_map(&read, map).await {
                Ok(written) => return Ok(Edited::Written(written, with)),
                Err(conflict @ ControlError::Conflict { .. }) => last = Some(conflict),
                Err(other) => return Err(other),
            }
        }
        Err(last.unwrap_or(ControlError::Conflict {
            expected: 0,
            current: 0,
        }))
    }

    /// Writes `map` (validated first) at the map's key in one transaction
    /// if `compare` holds: `Ok(the map written)`, or `Err(the map etcd
    /// holds)` when it does not. `what` names the change in errors.
    async fn put_map_if(
        &mut self,
        compare: Compare,
        map: ClusterMap,
        what: &'static str,
    ) -> Result<Result<VersionedMap, VersionedMap>, ControlError> {
        let key = self.keys.map();
        map.topology_at(&key)?;
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.clone(), map.to_json(), None)])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self.client.txn(txn).await.map_err(self.failed(what, key))?;
        if !response.succeeded() {
            return Ok(Err(self.current_in(&response)?));
        }
        let revision = response.header().map_or(0, |h| h.revision());
        Ok(Ok(VersionedMap { map, revision }))
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
        let key = self.keys.member(member.role, &member.name);
        let lease = self
            .client
            .lease_grant(ttl, None)
            .await
            .map_err(self.failed("lease grant", key.clone()))?
            .id();
        let value = serde_json::to_string(member).unwrap_or_default();
        self.client
            .put(
                key.clone(),
                value,
                Some(PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(self.failed("registration", key.clone()))?;
        let (mut keeper, mut stream) = self
            .client
            .lease_keep_alive(lease)
            .await
            .map_err(self.failed("lease keep-alive", key.clone()))?;
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
            .map_err(self.failed("read of the members", under.clone()))?;
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
        let key = self.keys.intent(role, name);
        self.client
            .put(key.clone(), intent.as_str(), None)
            .await
            .map_err(self.failed("write of an intent", key))?;
        Ok(())
    }

    /// The regions that had a single copy on `server` when its drain
    /// began, if a drain recorded them.
    pub async fn drain_single_copies(
        &mut self,
        server: &str,
    ) -> Result<Option<Vec<String>>, ControlError> {
        let key = self.keys.drain_single_copies(server);
        let response = self
            .client
            .get(key.clone(), None)
            .await
            .map_err(self.failed("read of a drain's single-copy regions", key))?;
        Ok(response.kvs().first().map(|kv| {
            String::from_utf8_lossy(kv.value())
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect()
        }))
    }

    /// Records the regions that have a single copy on `server` as its
    /// drain begins, so that a drain run again keeps them single-copy.
    pub async fn record_drain_single_copies(
        &mut self,
        server: &str,
        regions: &[String],
    ) -> Result<(), ControlError> {
        let key = self.keys.drain_single_copies(server);
        self.client
            .put(key.clone(), regions.join("\n"), None)
            .await
            .map_err(self.failed("write of a drain's single-copy regions", key))?;
        Ok(())
    }

    /// Forgets the regions recorded by [`ControlPlane::record_drain_single_copies`]
    /// once `server`'s drain ended: a later drain of a server of that name
    /// records its own.
    pub async fn forget_drain_single_copies(&mut self, server: &str) -> Result<(), ControlError> {
        let key = self.keys.drain_single_copies(server);
        self.client
            .delete(key.clone(), None)
            .await
            .map_err(self.failed("delete of a drain's single-copy regions", key))?;
        Ok(())
    }

    /// Every recorded intent; malformed records are skipped with a warning.
    pub async fn intents(&mut self) -> Result<Vec<(Role, String, Intent)>, ControlError> {
        let under = self.keys.intents();
        let response = self
            .client
            .get(under.clone(), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(self.failed("read of the intents", under.clone()))?;
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
            .map_err(|source| ControlError::Etcd {
                what: "update of the liveness record",
                source,
            })?;
        Ok(())
    }

    /// Ends the lease now: the member's key goes with it.
    pub async fn revoke(mut self) -> Result<(), ControlError> {
        self.task.abort();
        self.client
            .lease_revoke(self.lease)
            .await
            .map_err(|source| ControlError::Etcd {
                what: "lease revoke",
                source,
            })?;
        Ok(())
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.task.abort();
    }
}
