//! `testbed up` supervising its daemons, as a user drives it: the real
//! binary, real daemons, a daemon killed with SIGKILL, its exit reported on
//! the console, `testbed status` and `testbed restart` from another
//! process, and the client library served again afterwards.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use testkit::{FabricSpec, Ports};
use topology::VirtAddr;

/// Generous: the machine is shared and loaded; nothing here is timed.
const PATIENCE: Duration = Duration::from_secs(120);

/// A `testbed up` process and its console.
struct Up {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    seen: Vec<String>,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Up {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = FabricSpec::new()
            .server("A", &[("A1", "16MiB")])
            .server("B", &[("B1", "16MiB")])
            .device("F1")
            .device("F2")
            .client("c1")
            .client("c2")
            .write(dir.path(), "topology.toml", &mut Ports::new());
        let mut child = Command::new(env!("CARGO_BIN_EXE_testbed"))
            .args(["up", config.to_str().expect("utf-8 path"), "--data-dir"])
            .arg(dir.path().join("data"))
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start testbed up");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut up = Self {
            child,
            stdin,
            lines,
            seen: Vec::new(),
            dir,
            config,
        };
        up.wait_for("fabric is up", |l| l.contains("fabric is up"));
        up
    }

    /// Reads console lines until one satisfies `wanted`; returns it.
    fn wait_for(&mut self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if wanted(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no {what} on the console; it printed:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Runs `testbed ARGS` from the run's folder, as from another shell.
    fn testbed(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_testbed"))
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run testbed")
    }

    fn keys(&self) -> PathBuf {
        self.seen
            .iter()
            .find_map(|l| l.strip_prefix("keys: ")?.split_whitespace().next())
            .map(|dir| self.dir.path().join(dir))
            .unwrap_or_else(|| panic!("no keys line: {:#?}", self.seen))
    }

    fn pool(&self, client: &str) -> pmem_client::Pool {
        let topology = topology::Topology::load(&self.config).expect("topology");
        pmem_client::Pool::builder(topology, client)
            .secrets(self.keys())
            .connect()
            .unwrap_or_else(|e| panic!("connect: {}", pmem_client::error_chain(&e)))
    }

    /// SIGTERM; every daemon must report stopped and the exit be 0.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM);
        }
        let status = self.child.wait().expect("wait");
        let rest: Vec<String> = self.lines.iter().collect();
        assert!(status.success(), "{rest:#?}");
        assert_eq!(
            rest.iter().filter(|l| l.ends_with(": stopped")).count(),
            4,
            "{rest:#?}"
        );
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The pid `testbed status` gives for `daemon id`.
fn pid_of(status: &str, daemon: &str, id: &str) -> i32 {
    status
        .lines()
        .find_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                [d, i, "pid", pid, ..] if *d == daemon && *i == id => pid.parse().ok(),
                _ => None,
            }
        })
        .unwrap_or_else(|| panic!("no pid for {daemon} {id} in:\n{status}"))
}

/// The virtual address of region `region` as the client sees it.
fn region_addr(pool: &pmem_client::Pool, region: &str) -> VirtAddr {
    pool.regions()
        .into_iter()
        .find(|(id, _, _)| id == region)
        .map(|(_, addr, _)| addr)
        .unwrap_or_else(|| panic!("no region {region}: {:?}", pool.regions()))
}

/// A zombie child of `parent` with this pid (not reaped).
fn is_defunct_child_of(pid: i32, parent: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state ppid …`: the comm may hold spaces, the rest not.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str())
}

#[test]
fn a_killed_server_is_reported_reaped_and_restarted_from_another_shell() {
    let mut up = Up::start();
    // Ready-to-paste pmemctl lines name this fabric's topology, client and keys.
    let pmemctl = up
        .seen
        .iter()
        .find(|l| l.trim_start().starts_with("pmemctl --config ") && l.contains(" map"))
        .unwrap_or_else(|| panic!("no pmemctl line: {:#?}", up.seen))
        .clone();
    assert!(pmemctl.contains("--client c1 --secrets "), "{pmemctl}");
    assert!(pmemctl.contains("topology.toml"), "{pmemctl}");

    let pool = up.pool("c1");
    let b1 = region_addr(&pool, "B1");
    pool.write_persist(b1, b"before the kill")
        .unwrap_or_else(|e| panic!("write: {}", pmem_client::error_chain(&e)));
    drop(pool);

    let status = up.testbed(&["status"]);
    assert!(status.status.success(), "{}", text(&status));
    let pid = pid_of(&text(&status), "pmem-server", "B");
    // SAFETY: kill(2) with SIGKILL on the pid testbed reported for server B.
    let killed = unsafe { libc::kill(pid, libc::SIGKILL) };
    assert_eq!(killed, 0, "kill -9 {pid}");

    let report = up.wait_for("a report of server B's exit", |l| {
        l.contains(&format!("pmem-server B (pid {pid})"))
    });
    assert!(report.contains("killed by signal 9 (SIGKILL)"), "{report}");
    assert!(report.contains(" UTC"), "the report says when: {report}");
    assert!(
        !is_defunct_child_of(pid, up.child.id()),
        "server B was left <defunct>"
    );

    // The console takes commands too.
    writeln!(up.stdin, "status").expect("type status");
    let line = up.wait_for("server B in the console's status", |l| {
        l.contains("pmem-server") && l.contains(&format!("pid {pid} "))
    });
    assert!(
        line.contains("exited at") && line.contains("SIGKILL"),
        "{line}"
    );

    let unknown = up.testbed(&["restart", "Z"]);
    assert!(!unknown.status.success(), "{}", text(&unknown));
    assert!(
        text(&unknown).contains("no daemon \"Z\""),
        "{}",
        text(&unknown)
    );

    let restart = up.testbed(&["restart", "B"]);
    assert!(restart.status.success(), "{}", text(&restart));
    assert!(
        text(&restart).contains("pmem-server B restarted"),
        "{}",
        text(&restart)
    );
    up.wait_for("the restart on the console", |l| {
        l.contains("pmem-server B restarted")
    });

    // The fabric serves B's region again, with what was written before.
    let pool = up.pool("c2");
    let back = pool
        .read(b1, 15)
        .unwrap_or_else(|e| panic!("read after restart: {}", pmem_client::error_chain(&e)));
    assert_eq!(&back, b"before the kill");
    pool.write_persist(b1, b"after restart")
        .unwrap_or_else(|e| panic!("write after restart: {}", pmem_client::error_chain(&e)));
    drop(pool);
    up.stop();
}
