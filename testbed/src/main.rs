//! `testbed`: parses the command line and hands each command to its
//! function in [`testbed::cli`].

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use testbed::cli::{Cli, Command, bench, fabric, log_id, outcome, run, worker};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _log = log_id(&cli.command)
        .map(|id| telemetry::logging::init("testbed", &id, telemetry::logging::LogFormat::Text));
    match cli.command {
        Command::Validate { file, host } => fabric::validate(file.as_ref(), &host),
        Command::Up {
            file,
            net,
            data_dir,
            prometheus,
            format,
            map_from,
        } => outcome(
            fabric::up(fabric::UpArgs {
                file,
                net,
                data_dir,
                prometheus,
                format,
                map_from,
            })
            .map(|()| true),
        ),
        Command::Restart { target, control } => outcome(fabric::control(
            &format!("restart {}", target.join(" ")),
            control,
        )),
        Command::Status { control } => outcome(fabric::control("status", control)),
        Command::Keygen { file, secrets } => outcome(fabric::keygen(file.as_deref(), &secrets)),
        Command::Down { prefix } => fabric::down(prefix.as_deref()),
        Command::Run(args) => outcome(run::run_command(args)),
        Command::MapFollow {
            file,
            net,
            etcd_members,
            changes,
            reports,
        } => outcome(fabric::map_follow(
            file,
            net,
            etcd_members,
            changes,
            reports,
        )),
        Command::Demo { duration, reports } => outcome(run::demo(duration, reports)),
        Command::BenchRoce {
            bench,
            roce_io,
            busy_poll_us,
        } => outcome(bench::bench_roce(bench, roce_io, busy_poll_us)),
        Command::BenchVerbs(args) => outcome(bench::bench_verbs(args)),
        Command::BenchPersist { bench, size } => outcome(bench::bench_persist(bench, size)),
        Command::BenchPersistGuest {
            work,
            rounds,
            ops,
            warmup,
            size,
        } => outcome(bench::bench_persist_guest(work, rounds, ops, warmup, size)),
        Command::PowerCut {
            cuts,
            seed,
            medium,
            out,
        } => outcome(bench::power_cut(cuts, seed, medium, out)),
        Command::Bench {
            bench: args,
            idle_connections,
        } => outcome(bench::bench(args, idle_connections)),
        Command::Chaos(args) => outcome(run::chaos(args)),
        Command::Daemon { args } => match args.split_first() {
            Some((name, _)) if name == "pmem-server" => pmem_server::cli::main_with_args(args),
            Some((name, _)) if name == "fabric-device" => fabric_device::cli::main_with_args(args),
            _ => {
                eprintln!("testbed daemon: expected pmem-server or fabric-device");
                ExitCode::from(2)
            }
        },
        Command::Worker(args) => outcome(worker::worker_command(args)),
        Command::CheckLinearizable { dir, budget } => {
            outcome(run::check_linearizable(&dir, Duration::from_secs(budget)))
        }
    }
}
