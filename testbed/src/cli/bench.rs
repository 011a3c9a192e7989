//! The commands that measure: `bench`, `bench-roce`, `bench-verbs`,
//! `bench-persist` (and its guest side) and `power-cut`.

use std::path::PathBuf;

use super::args::*;

/// Where a report goes: `out`, or a fresh folder under `reports/`.
pub fn report_dir(out: Option<PathBuf>, kind: &str) -> PathBuf {
    out.unwrap_or_else(|| PathBuf::from("reports").join(crate::run::run_id(kind)))
}

/// `testbed bench`.
pub fn bench(
    BenchArgs { quick, rounds, out }: BenchArgs,
    idle_connections: Option<usize>,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench");
    let overrides = crate::bench::Overrides {
        rounds,
        idle_connections,
    };
    let (report, files) = crate::bench::run(quick, overrides, &out)?;
    println!("ratio                                       value");
    for (name, value) in &report.ratios {
        println!("{name:<43} {value:>6.2}");
    }
    println!(
        "\nreport: {}\nraw figures: {}",
        files.markdown.display(),
        files.json.display()
    );
    Ok(true)
}

/// `testbed bench-roce`.
pub fn bench_roce(
    BenchArgs { quick, rounds, out }: BenchArgs,
    roce_io: crate::bench::roce::RocePath,
    busy_poll_us: u64,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-roce");
    let mut plan = crate::bench::roce::RocePlan::new(quick, rounds);
    plan.roce_io = roce_io;
    plan.busy_poll_us = busy_poll_us;
    let report = crate::bench::roce::run(plan, &out)?;
    print!("{}", crate::bench::roce::markdown(&report));
    println!("\nreport: {}", out.display());
    Ok(true)
}

/// `testbed bench-verbs`.
pub fn bench_verbs(BenchArgs { quick, rounds, out }: BenchArgs) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-verbs");
    let plan = crate::lab::verbs_bench::VerbsPlan::new(quick, rounds);
    let report = crate::lab::verbs_bench::run(plan, &out)?;
    print!("{}", crate::lab::verbs_bench::markdown(&report));
    println!("\nreport: {}", out.display());
    Ok(true)
}

/// `testbed bench-persist`.
pub fn bench_persist(
    BenchArgs { quick, rounds, out }: BenchArgs,
    size: usize,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "bench-persist");
    let plan = crate::lab::persist_bench::PersistPlan::new(quick, rounds, size);
    let report = crate::lab::persist_bench::run(plan, &out)?;
    print!("{}", crate::lab::persist_bench::markdown(&report));
    println!("\nreport: {}", out.join("report.md").display());
    Ok(true)
}

/// `testbed power-cut`: true when nothing acknowledged was lost.
pub fn power_cut(
    cuts: usize,
    seed: u64,
    medium: crate::lab::power_cut::Medium,
    out: Option<PathBuf>,
) -> anyhow::Result<bool> {
    let out = report_dir(out, "power-cut");
    let plan = crate::lab::power_cut::PowerCutPlan {
        cuts,
        medium,
        seed,
        out: out.clone(),
    };
    let report = crate::lab::power_cut::run(&plan)?;
    print!("{}", crate::lab::power_cut::markdown(&report));
    println!("\nreport: {}", out.join("report.md").display());
    Ok(report.lost == 0)
}

/// `testbed bench-persist-guest`: `bench-persist`'s measurement inside its
/// guest.
pub fn bench_persist_guest(
    work: PathBuf,
    rounds: usize,
    ops: usize,
    warmup: usize,
    size: usize,
) -> anyhow::Result<bool> {
    let plan = crate::lab::persist_bench::PersistPlan {
        rounds: rounds.clamp(1, 100),
        ops: ops.max(1),
        warmup,
        size: size.clamp(1, 64 << 10),
    };
    let args = crate::lab::persist_bench::GuestArgs { work, plan };
    crate::lab::persist_bench::guest_main(&args).map(|()| true)
}
