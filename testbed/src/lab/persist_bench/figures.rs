//! `testbed bench-persist`'s figures from the guest's series, and its
//! report.

use anyhow::ensure;

use super::{
    DISK_MOUNT, GuestResults, PMEM_MOUNT, PersistPlan, PersistReport, Ratio, Series, System,
    SystemFigures,
};
use crate::stats::{median, quantile};

/// The figures from the guest's series: per system the median of the
/// rounds' p50 and the p99 over every operation; the ratios per round.
pub fn summarize(
    plan: PersistPlan,
    results: GuestResults,
    seconds: f64,
) -> anyhow::Result<PersistReport> {
    let mut systems = Vec::new();
    for system in System::ALL {
        let series: Vec<&Series> = results
            .series
            .iter()
            .filter(|s| s.system == system)
            .collect();
        ensure!(
            series.len() == plan.rounds && series.iter().all(|s| !s.us.is_empty()),
            "{}: {} of {} rounds measured",
            system.name(),
            series.len(),
            plan.rounds
        );
        let all: Vec<f64> = series.iter().flat_map(|s| s.us.iter().copied()).collect();
        let round_p50_us: Vec<f64> = series.iter().map(|s| quantile(&s.us, 0.5)).collect();
        systems.push(SystemFigures {
            system,
            what: system.what().to_owned(),
            p50_us: median(&round_p50_us),
            p99_us: quantile(&all, 0.99),
            round_p99_us: series.iter().map(|s| quantile(&s.us, 0.99)).collect(),
            round_p50_us,
        });
    }
    let p50s = |system: System| {
        systems
            .iter()
            .find(|f| f.system == system)
            .map(|f| f.round_p50_us.clone())
            .unwrap_or_default()
    };
    let ratio = |a: System, b: System| {
        let ratios: Vec<f64> = p50s(a)
            .iter()
            .zip(p50s(b))
            .map(|(x, y)| x / y.max(f64::MIN_POSITIVE))
            .collect();
        Ratio {
            median: median(&ratios),
            min: ratios.iter().copied().fold(f64::INFINITY, f64::min),
            max: ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    };
    Ok(PersistReport {
        plan,
        server_modes: results.server_modes,
        device_lines: results.device_lines,
        dax_over_redis: ratio(System::Dax, System::Redis),
        msync_over_redis: ratio(System::Msync, System::Redis),
        dax_over_redis_dax: ratio(System::Dax, System::RedisDax),
        systems,
        seconds,
    })
}

/// The report as Markdown.
pub fn markdown(report: &PersistReport) -> String {
    let plan = report.plan;
    let mut text = format!(
        "# One durable {} B write in one NVDIMM guest: WRITE_PERSIST (DAX, msync) next to redis\n\n\
         One lab guest (QEMU, 1 vCPU; TCG unless the host has KVM): an emulated NVDIMM as fsdax \
         (ext4 `-o dax` at {PMEM_MOUNT}) and a virtio disk (ext4 at {DISK_MOUNT}). The load \
         generator runs in the same guest, one request at a time over loopback; {} interleaved \
         rounds of {} operations per system (order rotating each round) after {} warm-up \
         operations each. p50 = median of the rounds' p50s; p99 over every operation. Under \
         emulation absolute times are emulation time; compare the ratios. Run took {:.0} s.\n\n\
         | system | what | p50 µs | p99 µs | rounds' p50 µs |\n|---|---|---:|---:|---|\n",
        plan.size, plan.rounds, plan.ops, plan.warmup, report.seconds
    );
    for f in &report.systems {
        let rounds: Vec<String> = f.round_p50_us.iter().map(|v| format!("{v:.0}")).collect();
        text.push_str(&format!(
            "| {} | {} | {:.0} | {:.0} | {} |\n",
            f.system.name(),
            f.what,
            f.p50_us,
            f.p99_us,
            rounds.join(", ")
        ));
    }
    text.push_str("\n| ratio of p50s | median of rounds | rounds' range |\n|---|---:|---|\n");
    for (name, r) in [
        ("dax / redis", report.dax_over_redis),
        ("msync / redis", report.msync_over_redis),
        ("dax / redis-dax", report.dax_over_redis_dax),
    ] {
        text.push_str(&format!(
            "| {name} | {:.2} | {:.2} – {:.2} |\n",
            r.median, r.min, r.max
        ));
    }
    text.push_str("\nServers: ");
    let modes: Vec<String> = report
        .server_modes
        .iter()
        .map(|(server, mode)| format!("{server} mode={mode}"))
        .collect();
    text.push_str(&modes.join(", "));
    text.push('\n');
    for line in &report.device_lines {
        text.push_str(&format!("- {line}\n"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results(rounds: usize) -> GuestResults {
        let mut r = GuestResults::default();
        r.server_modes.insert("D".into(), "dax".into());
        r.server_modes.insert("M".into(), "msync".into());
        for round in 0..rounds {
            for (system, base) in [
                (System::Dax, 100.0),
                (System::Msync, 400.0),
                (System::Redis, 200.0),
                (System::RedisDax, 150.0),
            ] {
                let us = (0..100).map(|i| base + i as f64 + round as f64).collect();
                r.series.push(Series { system, round, us });
            }
        }
        r
    }

    #[test]
    fn figures_are_medians_of_rounds_and_ratios_of_p50s() {
        let plan = PersistPlan::new(true, Some(3), 64);
        let report = summarize(plan, results(3), 1.0).expect("complete");
        let dax = &report.systems[0];
        assert_eq!(dax.system, System::Dax);
        // Round r's p50 (nearest rank of 100 values) is base + 49 + r.
        assert_eq!(dax.round_p50_us, vec![149.0, 150.0, 151.0]);
        assert_eq!(dax.p50_us, 150.0);
        // Rank 297 of the 300 values pooled from the three rounds.
        assert_eq!(dax.p99_us, 199.0);
        assert!((report.dax_over_redis.median - 150.0 / 250.0).abs() < 1e-9);
        assert!((report.msync_over_redis.median - 450.0 / 250.0).abs() < 1e-9);
        let text = markdown(&report);
        assert!(text.contains("| dax / redis | 0.60 |"), "{text}");
        assert!(text.contains("D mode=dax, M mode=msync"), "{text}");
    }

    #[test]
    fn a_missing_round_is_an_error() {
        let plan = PersistPlan::new(false, Some(4), 256);
        let err = summarize(plan, results(3), 1.0).expect_err("incomplete");
        assert!(err.to_string().contains("3 of 4 rounds"), "{err}");
    }
}
