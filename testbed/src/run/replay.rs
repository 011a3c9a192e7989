//! What a run was asked to do, as the report records it and as the command
//! line that runs it again.
//!
//! A replay runs the same workload with the same seed (so every task draws
//! the same operations and keys) against the same topology with the same
//! fault plan; how the tasks' requests interleave, and so what a read
//! races, depends on the machine and cannot be replayed.

use std::ffi::OsStr;
use std::path::Path;

use super::{RunOptions, Scenario};
use crate::fabric::launch::NetMode;
use crate::report::RunParameters;

/// The name a network mode has on the command line.
pub fn net_name(net: NetMode) -> &'static str {
    match net {
        NetMode::Loopback => "loopback",
        NetMode::Netns => "netns",
        NetMode::Lab => "lab",
    }
}

/// The parameters of `options` for the report.
pub fn parameters(options: &RunOptions) -> RunParameters {
    RunParameters {
        seed: options.seed,
        duration_s: options.duration.as_secs_f64(),
        size: options.size,
        depth: options.depth,
        keys: options.keys,
        zipfian: options.zipfian,
        clients: options.clients,
        net: net_name(options.net).to_owned(),
        // Every run's fabric makes keys and proves them.
        authenticate: true,
        scenario: options.scenario.map(|s| s.name().to_owned()),
        faults_planned: options.faults.len(),
        control: match options.control {
            crate::fabric::etcd::Control::File => None,
            crate::fabric::etcd::Control::Etcd { members } => {
                Some(format!("etcd, {members} member(s)"))
            }
        },
    }
}

/// The command line, run by `program`, that runs `options` again: `demo`
/// by its duration, `run` and `chaos` with every workload parameter
/// spelled out (and `chaos` with its scenario and number of faults).
pub fn command_line(program: &str, options: &RunOptions) -> String {
    let mut args: Vec<String> = vec![program.to_owned(), options.command.clone()];
    if options.command == "demo" {
        args.extend(["--duration".to_owned(), secs(options)]);
        args.extend(["--reports".to_owned(), path(&options.reports)]);
        return join(&args);
    }
    if let Some(file) = &options.topology_file {
        args.push(path(file));
    }
    let mut flag = |name: &str, value: String| {
        args.push(format!("--{name}"));
        args.push(value);
    };
    if let (Some(scenario), "chaos") = (options.scenario, options.command.as_str()) {
        flag("scenario", scenario.name().to_owned());
        flag("faults", options.faults.len().to_string());
    }
    flag("workload", options.workload.name().to_owned());
    if let Some(clients) = options.clients {
        flag("clients", clients.to_string());
    }
    flag("duration", secs(options));
    flag("size", options.size.to_string());
    flag("depth", options.depth.to_string());
    flag("keys", options.keys.to_string());
    flag("seed", options.seed.to_string());
    flag("net", net_name(options.net).to_owned());
    if let Some(copies) = options.replicas {
        flag("replicas", copies.to_string());
    }
    if let crate::fabric::etcd::Control::Etcd { members } = options.control {
        flag("control", "etcd".to_owned());
        flag("etcd-members", members.to_string());
    }
    if let Some(dir) = &options.data_dir {
        flag("data-dir", path(dir));
    }
    flag("reports", path(&options.reports));
    if options.server_cache != pmem_client::ServerCache::Auto {
        flag("server-cache", options.server_cache.name().to_owned());
    }
    if options.zipfian {
        args.push("--zipfian".to_owned());
    }
    join(&args)
}

/// The program as the user ran it when it is the testbed, else `testbed`.
pub fn program_name() -> String {
    std::env::args()
        .next()
        .filter(|arg0| Path::new(arg0).file_name() == Some(OsStr::new("testbed")))
        .unwrap_or_else(|| "testbed".to_owned())
}

fn secs(options: &RunOptions) -> String {
    options.duration.as_secs_f64().to_string()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// `args` as one line a POSIX shell splits back into them.
fn join(args: &[String]) -> String {
    args.iter()
        .map(|a| shell_word(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` quoted for a POSIX shell when it needs to be.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

impl Scenario {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::KillFabric => "kill-fabric",
            Scenario::KillServer => "kill-server",
            Scenario::FreezeServer => "freeze-server",
            Scenario::CutLink => "cut-link",
            Scenario::RestartAll => "restart-all",
            Scenario::KillEtcd => "kill-etcd",
            Scenario::KillEtcdLeader => "kill-etcd-leader",
            Scenario::AddServer => "add-server",
            Scenario::AddDevice => "add-device",
            Scenario::RemoveDevice => "remove-device",
            Scenario::KillOwnerAndDecider => "kill-owner-and-decider",
            Scenario::KillServerThenOther => "kill-server-then-other",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::workload::Workload;

    #[test]
    fn a_chaos_run_replays_with_every_parameter() {
        let mut options = RunOptions::new("chaos", Workload::YcsbA);
        options.scenario = Some(Scenario::RestartAll);
        options.faults = vec![];
        options.seed = 207;
        options.duration = Duration::from_millis(2500);
        options.zipfian = true;
        options.topology_file = Some(PathBuf::from("my topo.toml"));
        options.reports = PathBuf::from("/tmp/it's here");
        assert_eq!(
            command_line("testbed", &options),
            "testbed chaos 'my topo.toml' --scenario restart-all --faults 0 --workload ycsb-a \
             --duration 2.5 --size 256 --depth 8 --keys 4096 --seed 207 --net loopback \
             --reports '/tmp/it'\\''s here' --zipfian"
        );
        let p = parameters(&options);
        assert_eq!((p.seed, p.scenario.as_deref()), (207, Some("restart-all")));
        assert_eq!(
            (p.duration_s, p.zipfian, p.net.as_str()),
            (2.5, true, "loopback")
        );
    }

    #[test]
    fn a_run_on_its_own_data_replays_on_it() {
        let mut options = RunOptions::new("run", Workload::Counter);
        options.clients = Some(1);
        options.data_dir = Some(PathBuf::from("data"));
        options.net = NetMode::Netns;
        assert_eq!(
            command_line("target/release/testbed", &options),
            "target/release/testbed run --workload counter --clients 1 --duration 10 --size 256 \
             --depth 8 --keys 4096 --seed 42 --net netns --data-dir data --reports reports"
        );
    }

    #[test]
    fn the_demo_replays_by_its_duration() {
        let mut options = RunOptions::new("demo", Workload::Mixed);
        options.duration = Duration::from_secs(30);
        assert_eq!(
            command_line("testbed", &options),
            "testbed demo --duration 30 --reports reports"
        );
    }
}
