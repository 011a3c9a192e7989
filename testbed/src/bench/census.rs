//! Who had the CPUs during a measurement: every process's CPU time and the
//! machine's idle time read from `/proc` before and after, and the
//! processes that used the most in between.
//!
//! Round trips on a small VM depend on whether the CPUs sleep between
//! messages: a process that keeps a CPU busy (spinning, or simply
//! running) removes the wake-ups and makes a round trip look faster than
//! the floor. A census taken around each latency measurement says whether
//! that happened, and who did it.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

/// How many processes a census names.
const TOP: usize = 5;

/// The CPU times at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    /// Ticks every CPU spent idle since boot (`/proc/stat`, `cpu` line).
    idle_ticks: u64,
    /// Each process's name and CPU ticks.
    processes: HashMap<u32, Ticks>,
}

/// A process's name and CPU ticks (user + system) at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ticks {
    /// Its command line's first words (its command name when it has none).
    name: String,
    /// Its own threads' ticks.
    own: u64,
    /// The ticks of its children that ended and were waited for: a
    /// measurement's peers (sockperf) end before it does and are counted
    /// here, under the process that ran them.
    children: u64,
}

/// One process's share of a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuUser {
    /// Its pid.
    pub pid: u32,
    /// Its command line's first words, or "children of …" for the CPU of
    /// its children that ended during the measurement.
    pub command: String,
    /// CPU seconds it used during the measurement.
    pub cpu_s: f64,
}

/// What the CPUs did during one measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Census {
    /// The measurement.
    pub what: String,
    /// Its wall-clock length, seconds.
    pub wall_s: f64,
    /// The share of all CPUs' time they spent idle (0 to 1).
    pub idle_share: f64,
    /// The processes that used the most CPU, most first.
    pub top: Vec<CpuUser>,
}

/// The clock ticks per second of `/proc`'s times.
fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// The CPU times now. Processes that end while being read are left out.
pub fn snapshot() -> Snapshot {
    let idle_ticks = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|text| parse_idle_ticks(&text))
        .unwrap_or(0);
    let mut processes = HashMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((command, own, children)) = parse_stat(&text) {
                let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                let name = describe(&cmdline).unwrap_or(command);
                processes.insert(
                    pid,
                    Ticks {
                        name,
                        own,
                        children,
                    },
                );
            }
        }
    }
    Snapshot {
        at: Instant::now(),
        idle_ticks,
        processes,
    }
}

/// What happened between `before` and `after`, called `what`.
pub fn between(what: &str, before: &Snapshot, after: &Snapshot) -> Census {
    let ticks_per_second = ticks_per_second();
    let wall_s = after.at.saturating_duration_since(before.at).as_secs_f64();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let idle_s = after.idle_ticks.saturating_sub(before.idle_ticks) as f64 / ticks_per_second;
    let idle_share = if wall_s > 0.0 {
        (idle_s / (wall_s * cpus)).clamp(0.0, 1.0)
    } else {
        f64::NAN
    };
    let mut top: Vec<CpuUser> = Vec::new();
    for (&pid, now) in &after.processes {
        // A process that started meanwhile counts from zero.
        let was = before.processes.get(&pid);
        let own = now.own.saturating_sub(was.map_or(0, |t| t.own));
        let children = now.children.saturating_sub(was.map_or(0, |t| t.children));
        let seconds = |ticks: u64| ticks as f64 / ticks_per_second;
        if own > 0 {
            top.push(CpuUser {
                pid,
                command: now.name.clone(),
                cpu_s: seconds(own),
            });
        }
        if children > 0 {
            top.push(CpuUser {
                pid,
                command: format!("children of {}", now.name),
                cpu_s: seconds(children),
            });
        }
    }
    top.sort_by(|a, b| b.cpu_s.total_cmp(&a.cpu_s).then(a.pid.cmp(&b.pid)));
    top.truncate(TOP);
    Census {
        what: what.to_owned(),
        wall_s,
        idle_share,
        top,
    }
}

/// `f()`, and the census of the CPUs while it ran, called `what`.
pub fn around<T>(what: &str, f: impl FnOnce() -> T) -> (T, Census) {
    let before = snapshot();
    let out = f();
    let after = snapshot();
    (out, between(what, &before, &after))
}

/// The idle ticks of all CPUs: the fourth number of `/proc/stat`'s `cpu`
/// line (iowait, the fifth, is idle too).
fn parse_idle_ticks(stat: &str) -> Option<u64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    Some(fields.get(3)? + fields.get(4).copied().unwrap_or(0))
}

/// The command name, the user + system ticks, and the ended children's
/// user + system ticks of a `/proc/PID/stat` text; the name in parentheses
/// may hold spaces and parentheses.
fn parse_stat(text: &str) -> Option<(String, u64, u64)> {
    let (head, rest) = text.rsplit_once(')')?;
    let (_, command) = head.split_once('(')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let number = |i: usize| -> Option<u64> { fields.get(i)?.parse().ok() };
    let own = number(11)? + number(12)?;
    let children = number(13)? + number(14)?;
    Some((command.to_owned(), own, children))
}

/// At most the first four words of a `/proc/PID/cmdline` (the program by
/// its file name), 80 characters at most; `None` for a process without one
/// (a kernel thread).
fn describe(cmdline: &[u8]) -> Option<String> {
    let mut words = cmdline
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(String::from_utf8_lossy);
    let program = words.next()?;
    let program = program.rsplit('/').next().unwrap_or(&program).to_owned();
    let mut name = std::iter::once(program)
        .chain(words.take(3).map(|w| w.into_owned()))
        .collect::<Vec<_>>()
        .join(" ");
    if let Some((cut, _)) = name.char_indices().nth(80) {
        name.truncate(cut);
    }
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_the_name_and_the_ticks() {
        let text = "4242 (sock perf (x)) S 1 4242 4242 0 -1 4194560 150 0 0 0 \
                    700 35 0 0 20 0 3 0 100 1000 200 18446744073709551615";
        assert_eq!(parse_stat(text), Some(("sock perf (x)".to_owned(), 735, 0)));
        assert_eq!(parse_stat("4242 (cut short) S 1"), None);
    }

    #[test]
    fn a_command_line_is_named_by_its_program_and_first_words() {
        assert_eq!(
            describe(b"/usr/bin/testbed\0daemon\0fabric-device\0--config\0x.toml\0").as_deref(),
            Some("testbed daemon fabric-device --config")
        );
        assert_eq!(describe(b"").as_deref(), None);
        assert_eq!(describe(&[b'a'; 200]).map(|n| n.len()), Some(80));
    }

    #[test]
    fn the_idle_ticks_count_iowait_too() {
        let stat = "cpu  100 5 50 9000 40 0 3 0 0 0\ncpu0 50 2 25 4500 20 0 1 0 0 0\n";
        assert_eq!(parse_idle_ticks(stat), Some(9040));
        assert_eq!(parse_idle_ticks("intr 1 2 3\n"), None);
    }

    #[test]
    fn a_census_ranks_what_each_process_used_in_between() {
        let t0 = Instant::now();
        let at = |ms| t0 + std::time::Duration::from_millis(ms);
        let table = |rows: &[(u32, &str, u64, u64)]| {
            rows.iter()
                .map(|&(pid, name, own, children)| {
                    let name = name.to_owned();
                    (
                        pid,
                        Ticks {
                            name,
                            own,
                            children,
                        },
                    )
                })
                .collect()
        };
        let hz = ticks_per_second();
        let before = Snapshot {
            at: at(0),
            idle_ticks: 1_000,
            processes: table(&[
                (1, "init", 50, 0),
                (7, "testbed bench", 10, 0),
                (9, "gone", 5, 0),
            ]),
        };
        let after = Snapshot {
            at: at(1_000),
            idle_ticks: 1_000,
            processes: table(&[
                (1, "init", 50, 0),
                (7, "testbed bench", 10 + hz as u64 / 2, hz as u64 / 4),
                (12, "spinner", hz as u64, 0),
            ]),
        };
        let census = between("floor", &before, &after);
        assert_eq!(census.what, "floor");
        assert!((census.wall_s - 1.0).abs() < 1e-9);
        assert_eq!(census.idle_share, 0.0, "no idle tick: the CPUs never slept");
        let named: Vec<(u32, &str)> = census
            .top
            .iter()
            .map(|u| (u.pid, u.command.as_str()))
            .collect();
        assert_eq!(
            named,
            [
                (12, "spinner"),
                (7, "testbed bench"),
                (7, "children of testbed bench")
            ],
            "most first; a process that used nothing, or ended, is not named; children that \
             ended are counted under their parent"
        );
        assert!((census.top[0].cpu_s - 1.0).abs() < 0.02, "{census:?}");
    }
}
