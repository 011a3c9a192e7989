//! Taking over a dead owner's replicated regions: the core reports an
//! owner suspected; a thread probes it (a TCP connect to its client ports
//! from the topology, and its liveness record in etcd) and, when it is
//! dead and this device is next in turn ([`crate::succession`]), writes
//! this device into the map as the owner of each of its regions, one
//! transaction per region against the version this device runs
//! ([`control::ownership`]). The map watch then brings the new owners.
//!
//! With a topology file there is no place to record a new owner that
//! every device and client would agree on, so nothing is taken over: the
//! region's requests wait for its owner to come back (said once per
//! owner).

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;

use topology::{FabricDeviceId, ServerId};

use super::*;
use crate::forward::{HeardSince, OwnedRegion};
use crate::succession::{Decision, Liveness, Reach, decide, judge};

/// How long one connect of a probe may take.
const PROBE_CONNECT: Duration = Duration::from_millis(300);
/// After a probe, the same owner is not probed again for this long.
const PROBE_QUIET: Duration = Duration::from_millis(500);
/// How long after a takeover the deciding copy's server is watched for
/// refusing connections (a server killed with the owner accepts them
/// while its process is torn down, which can take seconds).
const RECHECK_FOR: Duration = Duration::from_secs(30);
/// How long a recheck waits for the event loop to say what it heard from
/// a server.
const ASK_LOOP_FOR: Duration = Duration::from_secs(2);
/// How often it is probed meanwhile.
const RECHECK_EVERY: Duration = Duration::from_millis(100);

/// Where the map lives, for the takeover threads.
#[derive(Debug, Clone)]
struct Etcd {
    endpoints: control::Endpoints,
    pool: String,
    credentials: Option<control::Credentials>,
}

/// What one probe (and takeover) thread found, for the event loop.
#[derive(Debug)]
struct Report {
    owner: FabricDeviceId,
    /// Log lines: (is a warning, text).
    lines: Vec<(bool, String)>,
    /// Some region was taken over: the map is to be read now.
    taken: bool,
}

/// The device's takeovers: probes in flight and recently done.
#[derive(Debug)]
pub(super) struct Takeovers {
    etcd: Option<Etcd>,
    probing: HashSet<FabricDeviceId>,
    quiet_until: HashMap<FabricDeviceId, Instant>,
    /// Owners already said to wait for (with a topology file).
    waited_for: HashSet<FabricDeviceId>,
    done_tx: mpsc::Sender<Report>,
    done_rx: mpsc::Receiver<Report>,
    asks_tx: mpsc::Sender<LoopAsk>,
    asks_rx: mpsc::Receiver<LoopAsk>,
    /// Servers a deciding role is being moved off: their links are not
    /// reconnected until the move's transaction is done, so nothing
    /// written meanwhile can be acknowledged by that copy alone.
    moving: HashSet<ServerId>,
}

impl Takeovers {
    /// No takeover until [`Takeovers::use_map_in`] names an etcd.
    pub(super) fn new() -> Self {
        let (done_tx, done_rx) = mpsc::channel();
        let (asks_tx, asks_rx) = mpsc::channel();
        Self {
            etcd: None,
            probing: HashSet::new(),
            quiet_until: HashMap::new(),
            waited_for: HashSet::new(),
            done_tx,
            done_rx,
            asks_tx,
            asks_rx,
            moving: HashSet::new(),
        }
    }

    /// Whether links to `server` are held down while a deciding role is
    /// moved off it.
    pub(super) fn holds_links_to(&self, server: &ServerId) -> bool {
        !self.moving.is_empty() && self.moving.contains(server)
    }

    /// Takes regions over in the etcd map of `source` from now on.
    pub(super) fn use_map_in(&mut self, source: &control::MapSource) {
        if let control::MapSource::Etcd {
            endpoints,
            pool,
            credentials,
        } = source
        {
            self.etcd = Some(Etcd {
                endpoints: endpoints.clone(),
                pool: pool.clone(),
                credentials: credentials.clone(),
            });
        }
    }
}

/// Everything a probe thread needs, taken from the loop's state.
struct Job {
    me: FabricDeviceId,
    owner: FabricDeviceId,
    /// Every fabric device, in the topology's order.
    devices: Vec<FabricDeviceId>,
    /// Each device's client ports.
    ports: HashMap<FabricDeviceId, Vec<String>>,
    /// Each server's NIC addresses.
    server_ports: HashMap<ServerId, Vec<String>>,
    regions: Vec<OwnedRegion>,
    etcd: Etcd,
}

/// A region just taken over whose deciding copy's server accepted the
/// takeover's probe: watched a moment longer, and its deciding role moved
/// if that server turns out dead ([`control::deciding`]).
#[derive(Debug)]
struct Recheck {
    region: String,
    /// The version of its record the takeover wrote.
    version: u64,
    deciding: String,
    /// The servers whose copies the takeover moved from serving to
    /// syncing.
    syncing: Vec<String>,
    /// The servers of its serving copies this device reached.
    reachable: Vec<String>,
    /// When the takeover began (before its transaction).
    since: Instant,
}

/// What a recheck thread asks of the event loop, which alone knows what
/// the device heard from a server.
#[derive(Debug)]
enum LoopAsk {
    /// What did this device hear from `server` since `since`? When
    /// nothing, with every link to it down, the loop holds its links down
    /// until [`LoopAsk::MoveDone`] and answers [`HeardSince::Silent`].
    Heard {
        server: String,
        since: Instant,
        answer: mpsc::SyncSender<HeardSince>,
    },
    /// The move off `server` is done (or was not made): its links may
    /// reconnect.
    MoveDone { server: String },
}

/// The recheck thread's line to the event loop.
struct LoopLine {
    asks: mpsc::Sender<LoopAsk>,
    waker: Arc<mio::Waker>,
}

impl LoopLine {
    fn send(&self, ask: LoopAsk) {
        if self.asks.send(ask).is_ok() {
            let _ = self.waker.wake();
        }
    }

    /// What the loop heard from `server` since `since`; `Linked` (wait and
    /// ask again) when it does not answer in time.
    fn heard_since(&self, server: &str, since: Instant) -> HeardSince {
        let (answer, heard) = mpsc::sync_channel(1);
        self.send(LoopAsk::Heard {
            server: server.to_owned(),
            since,
            answer,
        });
        heard
            .recv_timeout(ASK_LOOP_FOR)
            .unwrap_or(HeardSince::Linked)
    }
}

/// What a recheck found of a deciding copy's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecidingServer {
    /// Every port refuses, it said nothing since the takeover and no link
    /// to it is up: its role is moved (its links held down meanwhile).
    Dead,
    /// It answered this device after the takeover, so it may hold writes
    /// acknowledged since on its copy alone: its copy keeps deciding.
    AnsweredSince,
    /// It accepts connections, or a link to it is still up: asked again.
    NotYet,
}

/// A TCP connect to each of `addrs`: accepted by one, refused by all, or
/// neither.
fn connect_probe(addrs: &[String]) -> Reach {
    let mut refused = 0;
    for addr in addrs {
        let Ok(addr) = addr.parse::<SocketAddr>() else {
            continue;
        };
        match TcpStream::connect_timeout(&addr, PROBE_CONNECT) {
            Ok(_) => return Reach::Accepted,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => refused += 1,
            Err(_) => {}
        }
    }
    if refused > 0 && refused == addrs.len() {
        Reach::Refused
    } else {
        Reach::Unknown
    }
}

impl Job {
    /// Judges `device`: its ports first; its lease only when they do not
    /// refuse (a frozen process still accepts connections).
    fn probe(&self, device: &FabricDeviceId) -> Liveness {
        let reach = connect_probe(
            self.ports
                .get(device)
                .map(Vec::as_slice)
                .unwrap_or_default(),
        );
        if reach == Reach::Refused {
            return Liveness::Dead;
        }
        let lease = control::ownership::device_registered(
            &self.etcd.endpoints,
            &self.etcd.pool,
            self.etcd.credentials.as_ref(),
            device.as_str(),
        );
        let lease = match lease {
            Ok(present) => Some(present),
            Err(e) => {
                debug!(
                    "cannot read fabric device {device}'s liveness record: {}",
                    error_chain(&e)
                );
                None
            }
        };
        judge(reach, lease)
    }

    /// Probes, decides and takes over; what happened, for the loop, and
    /// the regions taken over whose deciding copy is to be watched.
    fn run(&self) -> (Report, Vec<Recheck>) {
        let mut report = Report {
            owner: self.owner.clone(),
            lines: Vec::new(),
            taken: false,
        };
        let mut rechecks = Vec::new();
        let (me, owner) = (&self.me, &self.owner);
        match decide(&self.devices, me, owner, |d| self.probe(d)) {
            Decision::OwnerAlive | Decision::NotASuccessor => {}
            Decision::Defer(next) => report.lines.push((
                false,
                format!(
                    "fabric device {owner} is dead; {next} is before this device in turn to take \
                     its regions over"
                ),
            )),
            Decision::TakeOver => rechecks = self.take_all(&mut report),
        }
        (report, rechecks)
    }

    /// The servers of the owner's regions' serving copies that this
    /// device cannot use to decide: no link up from here, or every NIC
    /// port refusing a connection now (the server died, perhaps with the
    /// owner, and this device has not seen its links break yet).
    fn unreachable_servers(&self) -> Vec<String> {
        let mut judged: HashMap<&ServerId, bool> = HashMap::new();
        for (server, link_up) in self.regions.iter().flat_map(|r| &r.serving) {
            if judged.contains_key(server) {
                continue;
            }
            let dead = !*link_up
                || connect_probe(
                    self.server_ports
                        .get(server)
                        .map(Vec::as_slice)
                        .unwrap_or_default(),
                ) == Reach::Refused;
            judged.insert(server, dead);
        }
        let mut out: Vec<String> = judged
            .into_iter()
            .filter(|(_, dead)| *dead)
            .map(|(server, _)| server.to_string())
            .collect();
        out.sort();
        out
    }

    /// Takes every region of the owner over that this device reaches a
    /// serving copy of, one transaction each, over one etcd connection;
    /// a serving copy on a server it does not reach is passed over as the
    /// deciding copy. Returns the regions taken over, to be rechecked.
    fn take_all(&self, report: &mut Report) -> Vec<Recheck> {
        let (me, owner) = (&self.me, &self.owner);
        let mut rechecks = Vec::new();
        let mut regions = Vec::new();
        for region in &self.regions {
            if region.reachable {
                regions.push((region.region.as_str(), region.version));
            } else {
                report.lines.push((
                    true,
                    format!(
                        "region {}: its owner {owner} is dead, and this device has no link up \
                         to a serving copy: it does not take the region over",
                        region.region
                    ),
                ));
            }
        }
        if regions.is_empty() {
            return rechecks;
        }
        let since = Instant::now();
        let unreachable = self.unreachable_servers();
        if !unreachable.is_empty() {
            report.lines.push((
                false,
                format!(
                    "fabric device {owner} is dead and this device does not reach server {}: \
                     no copy there decides for the regions it takes over",
                    unreachable.join(", ")
                ),
            ));
        }
        let unreachable: Vec<&str> = unreachable.iter().map(String::as_str).collect();
        let outcomes = control::ownership::take_over_blocking(
            &self.etcd.endpoints,
            &self.etcd.pool,
            self.etcd.credentials.as_ref(),
            me.as_str(),
            &regions,
            &unreachable,
        );
        let outcomes = match outcomes {
            Ok(outcomes) => outcomes,
            Err(e) => {
                report.lines.push((
                    true,
                    format!(
                        "cannot take fabric device {owner}'s regions over: {}; their requests \
                         wait for it or another device",
                        error_chain(&e)
                    ),
                ));
                return rechecks;
            }
        };
        for (&(id, _), outcome) in regions.iter().zip(outcomes) {
            report.lines.push(match outcome {
                Ok(control::ownership::Takeover::Taken {
                    note,
                    version,
                    deciding,
                    syncing,
                    ..
                }) => {
                    report.taken = true;
                    let reachable = self
                        .regions
                        .iter()
                        .filter(|r| r.region.as_str() == id)
                        .flat_map(|r| &r.serving)
                        .map(|(server, _)| server.to_string())
                        .filter(|server| !unreachable.contains(&server.as_str()))
                        .collect();
                    rechecks.push(Recheck {
                        region: id.to_owned(),
                        version,
                        deciding,
                        syncing,
                        reachable,
                        since,
                    });
                    (
                        false,
                        format!("took region {id} over from dead fabric device {owner}: {note}"),
                    )
                }
                Ok(control::ownership::Takeover::Lost {
                    owner: now,
                    version,
                }) => (
                    false,
                    format!(
                        "region {id}: its record moved on before this device took it over \
                         (owner {now}, version {version}); following the map"
                    ),
                ),
                Err(e) => (
                    true,
                    format!(
                        "{}; the region's requests wait for its owner or another device",
                        error_chain(&e)
                    ),
                ),
            });
        }
        rechecks
    }

    /// Watches the deciding copies' servers of the regions just taken
    /// over for up to [`RECHECK_FOR`]. One whose every port refuses (it
    /// died with the owner, and accepted the takeover's probe while its
    /// process was torn down) has its regions' deciding role moved to
    /// another copy in a second transaction, but only when the event loop
    /// heard nothing from it since the takeover and has no link up to it:
    /// a server that confirmed the new owner's epoch may have acknowledged
    /// writes its copy alone holds, and keeps the role (the region waits
    /// for it). A server that keeps accepting (alive, or frozen) is left
    /// deciding. What each round did is handed to `publish` at once (a
    /// region whose role moved is not logged 30 s late because another
    /// region's deciding server is alive).
    fn recheck(&self, mut pending: Vec<Recheck>, line: &LoopLine, publish: impl Fn(Report)) {
        let until = Instant::now() + RECHECK_FOR;
        loop {
            let mut report = Report {
                owner: self.owner.clone(),
                lines: Vec::new(),
                taken: false,
            };
            let mut judged: HashMap<String, DecidingServer> = HashMap::new();
            let mut left = Vec::new();
            for check in pending {
                let verdict = *judged
                    .entry(check.deciding.clone())
                    .or_insert_with(|| self.judge_deciding(&check, line));
                match verdict {
                    DecidingServer::Dead => self.move_deciding(&check, &mut report),
                    DecidingServer::AnsweredSince => report.lines.push((
                        true,
                        format!(
                            "server {} refuses connections, but it answered this device after \
                             it took region {} over: its copy keeps deciding (it may hold writes \
                             acknowledged since), and the region waits for that server",
                            check.deciding, check.region
                        ),
                    )),
                    DecidingServer::NotYet => left.push(check),
                }
            }
            for (server, verdict) in judged {
                if verdict == DecidingServer::Dead {
                    line.send(LoopAsk::MoveDone { server });
                }
            }
            if !report.lines.is_empty() {
                publish(report);
            }
            pending = left;
            if pending.is_empty() || Instant::now() >= until {
                return;
            }
            std::thread::sleep(RECHECK_EVERY);
        }
    }

    /// Probes `check`'s deciding server and, when its ports refuse, asks
    /// the event loop what it heard from it since the takeover.
    fn judge_deciding(&self, check: &Recheck, line: &LoopLine) -> DecidingServer {
        let ports = self
            .server_ports
            .iter()
            .find(|(id, _)| id.as_str() == check.deciding)
            .map(|(_, ports)| ports.as_slice())
            .unwrap_or_default();
        if connect_probe(ports) != Reach::Refused {
            return DecidingServer::NotYet;
        }
        match line.heard_since(&check.deciding, check.since) {
            HeardSince::Silent => DecidingServer::Dead,
            HeardSince::Answered => DecidingServer::AnsweredSince,
            HeardSince::Linked => {
                // The loop may have answered Silent after the wait ended.
                line.send(LoopAsk::MoveDone {
                    server: check.deciding.clone(),
                });
                DecidingServer::NotYet
            }
        }
    }

    /// Moves `check`'s deciding role off its dead server, in etcd.
    fn move_deciding(&self, check: &Recheck, report: &mut Report) {
        let reachable: Vec<&str> = check
            .reachable
            .iter()
            .map(String::as_str)
            .filter(|s| *s != check.deciding)
            .collect();
        let was_serving: Vec<&str> = check.syncing.iter().map(String::as_str).collect();
        let ask = control::deciding::DecidingMove {
            region: &check.region,
            takeover_version: check.version,
            dead: &check.deciding,
            reachable: &reachable,
            was_serving: &was_serving,
        };
        let (region, dead) = (&check.region, &check.deciding);
        let moved = control::deciding::move_deciding_blocking(
            &self.etcd.endpoints,
            &self.etcd.pool,
            self.etcd.credentials.as_ref(),
            &ask,
        );
        report.lines.push(match moved {
            Ok(control::deciding::DecidingOutcome::Moved { note, .. }) => {
                report.taken = true;
                (
                    false,
                    format!(
                        "server {dead} refuses connections since this device took region \
                         {region} over with its copy deciding: {note}"
                    ),
                )
            }
            Ok(control::deciding::DecidingOutcome::Refused(why)) => (
                true,
                format!(
                    "server {dead} refuses connections since this device took region {region} \
                     over with its copy deciding, and the role stays: {why}"
                ),
            ),
            Err(e) => (
                true,
                format!(
                    "server {dead} refuses connections since this device took region {region} \
                     over with its copy deciding; cannot move the role in etcd: {}",
                    error_chain(&e)
                ),
            ),
        });
    }
}

impl Device {
    /// The core suspects `owner`: probe it (unless a probe is out or was
    /// just made) and take its regions over when it is dead.
    pub(super) fn owner_suspected(&mut self, owner: FabricDeviceId, now: Instant) {
        let Some(etcd) = self.takeovers.etcd.clone() else {
            if self.takeovers.waited_for.insert(owner.clone()) {
                info!(
                    "clients send this device requests for regions fabric device {owner} owns \
                     (their paths to it are down, or their map is behind); with a topology \
                     file no device takes a region over: they wait for {owner}"
                );
            }
            return;
        };
        let quiet = self
            .takeovers
            .quiet_until
            .get(&owner)
            .is_some_and(|&until| now < until);
        if quiet || self.takeovers.probing.contains(&owner) {
            return;
        }
        let topology = &self.config.topology;
        let job = Job {
            me: self.config.device.clone(),
            owner: owner.clone(),
            devices: topology
                .fabric_devices
                .iter()
                .map(|d| d.id.clone())
                .collect(),
            ports: topology
                .fabric_devices
                .iter()
                .map(|d| {
                    let listens = d.ports.iter().map(|p| p.listen.clone()).collect();
                    (d.id.clone(), listens)
                })
                .collect(),
            server_ports: topology
                .servers
                .iter()
                .map(|s| {
                    let listens = s.nics.iter().map(|n| n.listen.clone()).collect();
                    (s.id.clone(), listens)
                })
                .collect(),
            regions: self.core.owned_by(&owner),
            etcd,
        };
        let done = self.takeovers.done_tx.clone();
        let waker = self.waker();
        let line = LoopLine {
            asks: self.takeovers.asks_tx.clone(),
            waker: self.waker(),
        };
        let spawned = std::thread::Builder::new()
            .name("takeover".into())
            .spawn(move || {
                let (report, rechecks) = job.run();
                let _ = done.send(report);
                let _ = waker.wake();
                if !rechecks.is_empty() {
                    job.recheck(rechecks, &line, |report| {
                        let _ = done.send(report);
                        let _ = waker.wake();
                    });
                }
            });
        match spawned {
            Ok(_) => {
                self.takeovers.probing.insert(owner);
            }
            Err(e) => warn!("cannot start probing fabric device {owner}: {e}"),
        }
    }

    /// Takes what the probe threads found: logs it, and reads the map now
    /// after a takeover.
    pub(super) fn takeovers_done(&mut self, now: Instant) {
        self.answer_rechecks();
        let reports: Vec<Report> = self.takeovers.done_rx.try_iter().collect();
        for report in reports {
            for (warning, line) in &report.lines {
                if *warning {
                    warn!("{line}");
                } else {
                    info!("{line}");
                }
            }
            self.takeovers.probing.remove(&report.owner);
            self.takeovers
                .quiet_until
                .insert(report.owner, now + PROBE_QUIET);
            if report.taken
                && let Some(follow) = &self.follow
            {
                follow.watch.reread_now();
            }
        }
    }
}

impl Device {
    /// Answers the recheck threads' questions (what this device heard from
    /// a server since its takeover) and ends the link holds of finished
    /// moves.
    fn answer_rechecks(&mut self) {
        let asks: Vec<LoopAsk> = self.takeovers.asks_rx.try_iter().collect();
        for ask in asks {
            match ask {
                LoopAsk::Heard {
                    server,
                    since,
                    answer,
                } => {
                    let server = ServerId::from(server.as_str());
                    let mut heard = self.core.server_heard_since(&server, since);
                    if heard == HeardSince::Silent && self.connecting_to(&server) {
                        heard = HeardSince::Linked;
                    }
                    if heard == HeardSince::Silent {
                        self.takeovers.moving.insert(server);
                    }
                    let _ = answer.try_send(heard);
                }
                LoopAsk::MoveDone { server } => {
                    self.takeovers
                        .moving
                        .remove(&ServerId::from(server.as_str()));
                }
            }
        }
    }

    /// Whether a TCP connect to one of `server`'s links is under way.
    fn connecting_to(&self, server: &ServerId) -> bool {
        self.links.iter().any(|(link, conn)| {
            matches!(conn, LinkConn::Connecting { .. })
                && self
                    .core
                    .link_target(*link)
                    .is_some_and(|t| &t.server == server)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_nobody_listens_on_refuses_one_that_listens_accepts() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let open = listener.local_addr().expect("addr").to_string();
        let closed = {
            let gone = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            gone.local_addr().expect("addr").to_string()
        };
        assert_eq!(connect_probe(std::slice::from_ref(&open)), Reach::Accepted);
        assert_eq!(connect_probe(std::slice::from_ref(&closed)), Reach::Refused);
        assert_eq!(connect_probe(&[closed.clone(), open]), Reach::Accepted);
        assert_eq!(connect_probe(&[]), Reach::Unknown);
        assert_eq!(
            connect_probe(&["not an address".to_owned()]),
            Reach::Unknown
        );
    }
}
