//! `testbed up`'s supervision of its daemons: every exit reported as it
//! happens (which daemon, how it ended, when) and reaped, and commands —
//! typed on the console or sent by `testbed restart`/`testbed status` over
//! the run's control socket ([`control`]) — that show and restart them.
//!
//! One loop owns the [`Fabric`]: signals (SIGCHLD among them, so an exit is
//! noticed at once), console lines and control requests reach it over one
//! channel, and it looks for exited daemons after each and at least every
//! [`POLL`].

pub mod control;
pub mod exit;
pub mod pmemctl;
pub mod request;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal};
use std::path::Path;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pmem_client::error_chain;
use signal_hook::iterator::Signals;

use crate::fabric::launch::{DaemonKind, Exited, Fabric, log_tail};
use crate::report::format_utc_time_ms;
use control::{ControlSocket, Incoming};
use request::{Request, Target};

/// How often the loop looks for exited daemons when nothing wakes it.
pub const POLL: Duration = Duration::from_millis(250);

/// Something for the loop to handle.
#[derive(Debug)]
enum Event {
    /// A signal arrived.
    Signal(i32),
    /// A line typed on the console.
    Console(String),
    /// A request on the control socket.
    Control(Incoming),
}

impl From<Incoming> for Event {
    fn from(incoming: Incoming) -> Self {
        Event::Control(incoming)
    }
}

/// What became of one daemon process the supervisor saw exit.
#[derive(Debug, Clone)]
struct ExitRecord {
    unix_ms: u64,
    description: String,
}

/// The fabric and what the supervisor knows of its processes.
#[derive(Debug)]
pub struct Supervisor {
    fabric: Fabric,
    started: Instant,
    /// Exits already reported, by pid.
    exits: BTreeMap<u32, ExitRecord>,
    /// When each daemon's current process started (unix ms), by pid.
    since: BTreeMap<u32, u64>,
}

/// How the supervised fabric ended.
#[derive(Debug)]
pub struct Ended {
    /// The fabric, still to be stopped.
    pub fabric: Fabric,
    /// Daemons whose last process exited on its own and was not restarted,
    /// with a line saying when and how, to tell them from ones `stop` ends.
    pub dead: BTreeMap<(DaemonKind, String), String>,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Supervisor {
    /// Supervises `fabric` until SIGINT, SIGTERM or a `stop` command.
    /// `signals` must already be installed for SIGINT and SIGTERM (before
    /// the fabric started, so a Ctrl-C during its start is not lost);
    /// SIGCHLD is added here. The control socket goes into `run_dir`.
    pub fn run(fabric: Fabric, run_dir: &Path, signals: Signals) -> Ended {
        let mut supervisor = Self::new(fabric);
        let (tx, rx) = mpsc::channel();
        if let Err(e) = signals.add_signal(libc::SIGCHLD) {
            tracing::warn!("cannot watch SIGCHLD ({e}); exits are noticed within {POLL:?}");
        }
        spawn_signal_thread(signals, tx.clone());
        let socket = match ControlSocket::listen(run_dir, tx.clone()) {
            Ok(socket) => Some(socket),
            Err(e) => {
                println!(
                    "no control socket, so `testbed restart` cannot reach this run: {}",
                    error_chain(&e)
                );
                None
            }
        };
        let console = spawn_console_thread(tx);
        print!(
            "{}",
            supervisor.introduction(run_dir, socket.as_ref(), console)
        );
        supervisor.report_exits();
        loop {
            match rx.recv_timeout(POLL) {
                Ok(Event::Signal(libc::SIGINT | libc::SIGTERM)) => break,
                Ok(Event::Signal(_)) | Err(RecvTimeoutError::Timeout) => {}
                Ok(Event::Console(line)) => {
                    if line.trim().is_empty() {
                        continue;
                    }
                    supervisor.report_exits();
                    match request::parse(&line) {
                        Ok(Request::Stop) => break,
                        Ok(request) => {
                            let (text, _) = supervisor.execute(&request, true);
                            println!("{text}");
                        }
                        Err(e) => println!("{e}"),
                    }
                }
                Ok(Event::Control(incoming)) => {
                    supervisor.report_exits();
                    match request::parse(&incoming.line) {
                        Ok(Request::Stop) => {
                            incoming.answer("stopping the fabric", true);
                            println!("stop requested over the control socket");
                            break;
                        }
                        Ok(request) => {
                            if let Request::Restart(_) = request {
                                println!("control socket: {}", incoming.line);
                            }
                            let (text, ok) = supervisor.execute(&request, false);
                            if let Request::Restart(_) = request {
                                println!("{text}");
                            }
                            incoming.answer(&text, ok);
                        }
                        Err(e) => incoming.answer(&e.to_string(), false),
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
            supervisor.report_exits();
        }
        drop(socket);
        supervisor.report_exits();
        supervisor.ended()
    }

    fn new(fabric: Fabric) -> Self {
        let now = now_unix_ms();
        let since = Self::all_daemons(&fabric)
            .iter()
            .filter_map(|(kind, id)| fabric.pid(*kind, id))
            .map(|pid| (pid, now))
            .collect();
        Self {
            fabric,
            started: Instant::now(),
            exits: BTreeMap::new(),
            since,
        }
    }

    fn all_daemons(fabric: &Fabric) -> Vec<(DaemonKind, String)> {
        [DaemonKind::PmemServer, DaemonKind::FabricDevice]
            .into_iter()
            .flat_map(|kind| {
                fabric
                    .daemon_ids(kind)
                    .into_iter()
                    .map(move |id| (kind, id))
            })
            .collect()
    }

    /// The lines printed once the loop runs: how to reach it.
    fn introduction(
        &self,
        run_dir: &Path,
        socket: Option<&ControlSocket>,
        console: bool,
    ) -> String {
        let mut out = String::new();
        let example = Self::all_daemons(&self.fabric)
            .into_iter()
            .find(|(kind, _)| *kind == DaemonKind::PmemServer)
            .map_or_else(
                || "ID".to_owned(),
                |(kind, id)| self.restart_words(kind, &id),
            );
        if console {
            let _ = writeln!(
                out,
                "console: type `help`, `status` or `{example}` here and press Enter"
            );
        }
        if socket.is_some() {
            let run = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_owned());
            let _ = writeln!(
                out,
                "from another shell: testbed {example} --run {}   (or `testbed status --run …`)",
                run.display()
            );
        }
        out
    }

    /// `restart B`, or `restart server B` when a device is also called B.
    fn restart_words(&self, kind: DaemonKind, id: &str) -> String {
        let bare = Target {
            kind: None,
            id: id.to_owned(),
        };
        if bare.resolve(&Self::all_daemons(&self.fabric)).is_ok() {
            format!("restart {id}")
        } else {
            let word = match kind {
                DaemonKind::PmemServer => "server",
                DaemonKind::FabricDevice => "device",
            };
            format!("restart {word} {id}")
        }
    }

    /// Reaps exited daemons and prints one paragraph for each exit not
    /// reported yet.
    fn report_exits(&mut self) {
        for exited in self.fabric.reap_exited() {
            if self.exits.contains_key(&exited.pid) {
                continue;
            }
            let unix_ms = now_unix_ms();
            let description = exit::describe(exited.status);
            println!("{}", self.exit_paragraph(&exited, unix_ms, &description));
            self.exits.insert(
                exited.pid,
                ExitRecord {
                    unix_ms,
                    description,
                },
            );
        }
    }

    fn exit_paragraph(&self, exited: &Exited, unix_ms: u64, description: &str) -> String {
        let mut out = format!(
            "{} (+{:.1} s since up): {} {} (pid {}) {description}",
            format_utc_time_ms(unix_ms),
            self.started.elapsed().as_secs_f64(),
            exited.kind.program(),
            exited.id,
            exited.pid,
        );
        if let Some(log) = self.fabric.log_file(exited.kind, &exited.id) {
            // A daemon that exited by itself says why in its log.
            if exited.status.code().is_some() {
                let tail = log_tail(&log, 3);
                if !tail.is_empty() {
                    let _ = write!(
                        out,
                        "\n  last log lines:\n    {}",
                        tail.replace('\n', "\n    ")
                    );
                }
            }
            let _ = write!(out, "\n  log: {}", log.display());
        }
        let words = self.restart_words(exited.kind, &exited.id);
        let _ = write!(
            out,
            "\n  type `{words}` here or run `testbed {words}` from another shell to start it again"
        );
        out
    }

    /// Carries out a request; returns its answer and whether it did what
    /// was asked. `console`: the request was typed here, so progress may be
    /// printed as it goes.
    fn execute(&mut self, request: &Request, console: bool) -> (String, bool) {
        match request {
            Request::Help => (request::HELP.to_owned(), true),
            Request::Status => (self.status(), true),
            Request::Stop => ("stopping".to_owned(), true),
            Request::Restart(target) => self.restart(target, console),
        }
    }

    fn restart(&mut self, target: &Target, console: bool) -> (String, bool) {
        let (kind, id) = match target.resolve(&Self::all_daemons(&self.fabric)) {
            Ok(found) => found,
            Err(why) => return (why, false),
        };
        let name = format!("{} {id}", kind.program());
        let running = self
            .fabric
            .pid(kind, &id)
            .is_some_and(|pid| !self.exits.contains_key(&pid));
        if console {
            let how = if running {
                " (it is running: killed first)"
            } else {
                ""
            };
            println!("restarting {name}{how} …");
        }
        let result = self.fabric.restart(kind, &id).and_then(|()| {
            if kind == DaemonKind::PmemServer {
                // The devices reconnect by themselves; the fabric serves
                // this server's regions again once they have.
                self.fabric.await_all_links()
            } else {
                Ok(())
            }
        });
        let pid = self.fabric.pid(kind, &id);
        if let Some(pid) = pid {
            self.since.insert(pid, now_unix_ms());
        }
        match result {
            Ok(()) => {
                let links = if kind == DaemonKind::PmemServer {
                    "; every fabric device's links are up again"
                } else {
                    "; its links are up"
                };
                let pid = pid.map_or_else(String::new, |p| format!(" (pid {p})"));
                (format!("{name} restarted{pid} and ready{links}"), true)
            }
            Err(e) => (
                format!("{name} did not come back: {}", error_chain(&e)),
                false,
            ),
        }
    }

    /// One line per daemon: pid and running since, or how it ended.
    fn status(&self) -> String {
        let mut out = String::new();
        for (kind, id) in Self::all_daemons(&self.fabric) {
            let Some(pid) = self.fabric.pid(kind, &id) else {
                continue;
            };
            let state = match self.exits.get(&pid) {
                Some(exit) => format!(
                    "exited at {}: {}",
                    format_utc_time_ms(exit.unix_ms),
                    exit.description
                ),
                None => match self.since.get(&pid) {
                    Some(&ms) => format!("running since {}", format_utc_time_ms(ms)),
                    None => "running".to_owned(),
                },
            };
            let _ = writeln!(
                out,
                "  {:<14} {:<6} pid {:<8} {state}",
                kind.program(),
                id,
                pid
            );
        }
        out.trim_end().to_owned()
    }

    fn ended(self) -> Ended {
        let dead = Self::all_daemons(&self.fabric)
            .into_iter()
            .filter_map(|(kind, id)| {
                let pid = self.fabric.pid(kind, &id)?;
                let exit = self.exits.get(&pid)?;
                let text = format!(
                    "had exited at {} ({}) and was not restarted",
                    format_utc_time_ms(exit.unix_ms),
                    exit.description
                );
                Some(((kind, id), text))
            })
            .collect();
        Ended {
            fabric: self.fabric,
            dead,
        }
    }
}

fn spawn_signal_thread(mut signals: Signals, events: Sender<Event>) {
    let spawned = std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || {
            for signal in signals.forever() {
                if events.send(Event::Signal(signal)).is_err() {
                    break;
                }
            }
        });
    if let Err(e) = spawned {
        println!("cannot watch signals ({e}): stop the fabric with `stop` on the console");
    }
}

/// Reads console lines from stdin, unless stdin is a terminal this process
/// does not own (a background job reading it would be stopped). Returns
/// whether the console is read.
fn spawn_console_thread(events: Sender<Event>) -> bool {
    let stdin = std::io::stdin();
    if stdin.is_terminal() && !in_foreground() {
        return false;
    }
    let spawned = std::thread::Builder::new()
        .name("console".to_owned())
        .spawn(move || {
            for line in stdin.lock().lines().map_while(Result::ok) {
                if events.send(Event::Console(line)).is_err() {
                    break;
                }
            }
        });
    spawned.is_ok()
}

/// Whether this process's group owns the terminal on stdin.
fn in_foreground() -> bool {
    // SAFETY: tcgetpgrp and getpgrp only read process state; fd 0 is ours.
    unsafe { libc::tcgetpgrp(0) == libc::getpgrp() }
}
