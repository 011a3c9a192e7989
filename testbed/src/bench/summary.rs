//! The bench report's readable summary (`report.md`), one section per
//! function.

use std::fmt::Write as _;

use super::{BenchReport, cache_policy, replicated};

/// Each tracked ratio with the target it is held to.
const TARGETS: &[(&str, &str)] = &[
    ("fabric_p50_over_floor_rtt", "≤ 2.3"),
    ("direct_p50_over_floor_rtt", "≤ 1.2"),
    ("fabric_tput_over_redis", "≥ 1.0"),
    ("fabric_bw_over_floor_bw", "≥ 0.5"),
    ("direct_bw_over_floor_bw", "≥ 0.8"),
    ("fabric_persist_p50_over_redis_aof", "≤ 0.5"),
    ("authenticated_read_p50_over_plain", "≈ 1.0 (noise)"),
    ("fabric_p99_over_floor_p99", "≤ 3.0"),
    ("device_cpu_us_per_op", "≤ 0.5"),
    ("device_busy_cpu_us_per_op", "(for information)"),
    ("fabric_cpu_per_op_over_redis", "(for information)"),
    ("direct_p99_over_floor_p99", "(for information)"),
    ("fabric_p50_over_spinning_floor", "(for information)"),
    ("fabric_p99_over_spinning_floor_p99", "(for information)"),
    ("direct_p50_over_spinning_floor", "(for information)"),
    ("direct_p99_over_spinning_floor_p99", "(for information)"),
    (replicated::PERSIST_RATIO, "≤ 1.5"),
    (replicated::READ_RATIO, "≥ 1.0"),
    (cache_policy::READ_P99_RATIO, "(for information)"),
    (cache_policy::WRITE_P99_RATIO, "(for information)"),
];

/// The report's readable summary.
pub fn markdown(report: &BenchReport) -> String {
    let mut md = String::new();
    heading(&mut md, report);
    ratios(&mut md, report);
    floors(&mut md, report);
    census(&mut md, report);
    latency(&mut md, report);
    rates(&mut md, report);
    cache_policy(&mut md, report);
    replication(&mut md, report);
    authentication(&mut md, report);
    redis(&mut md, report);
    md
}

/// A CPU figure, or a dash when it was not measured.
fn cpu(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"))
}

fn heading(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "# pmem-fabric bench{}\n\n{} CPUs; each figure is one measurement of {} s; ratios are taken within this run. The fabric device busy-polls for {} µs after its last event (`--busy-poll-us`).\n",
        if report.quick {
            " (quick smoke run: figures are not meaningful)"
        } else {
            ""
        },
        report.cpus,
        report.plan.seconds,
        report.plan.device_busy_poll_us
    );
}

fn ratios(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "## Ratios\n\nMedians of {} rounds (the main pass, then interleaved rounds that \
         measure both sides of each ratio back to back), with the lowest and highest \
         round.\n\n| ratio | median | min | max | target |\n|---|---:|---:|---:|---|",
        report.plan.rounds.max(1)
    );
    for &(name, target) in TARGETS {
        let value = report.ratios.get(name).copied().unwrap_or(f64::NAN);
        let (min, max) = report
            .ratio_spread
            .get(name)
            .map_or((f64::NAN, f64::NAN), |s| (s.min, s.max));
        let _ = writeln!(
            md,
            "| `{name}` | {value:.2} | {min:.2} | {max:.2} | {target} |"
        );
    }
}

fn floors(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "\n## Floors\n\n| what | p50 µs | p99 µs | p99.9 µs |\n|---|---:|---:|---:|"
    );
    for (size, q) in &report.floor_rtt {
        let _ = writeln!(
            md,
            "| sockperf ping-pong {size} B, full RTT | {:.1} | {:.1} | {:.1} |",
            q.p50_us, q.p99_us, q.p999_us
        );
    }
    let q = &report.floor_rtt_same_cpu;
    let _ = writeln!(
        md,
        "| sockperf ping-pong 64 B, both on CPU 0 (context only) | {:.1} | {:.1} | {:.1} |",
        q.p50_us, q.p99_us, q.p999_us
    );
    if let Some(q) = &report.floor_rtt_spinning {
        let _ = writeln!(
            md,
            "| sockperf ping-pong 64 B, both ends polling (`--nonblocked`) | {:.1} | {:.1} | {:.1} |",
            q.p50_us, q.p99_us, q.p999_us
        );
    }
    let _ = writeln!(
        md,
        "\nThe ratios use the unpinned floors: pmem-fabric's client, device and server are \
         not pinned either. The sleeping floor's ends wait in a blocking read and pay a \
         wake-up per message, as the bench client and the server do; the spinning floor's \
         ends poll, as the device does (`*_over_spinning_floor*`, for information: on two \
         vCPUs three polling processes cannot each have a CPU).\n\n\
         iperf3, one stream: {:.2} GB/s\n",
        report.floor_bw_bytes_per_s / 1e9
    );
}

/// Per round, how idle the CPUs were during each 64 B round-trip
/// measurement and who used them most.
fn census(md: &mut String, report: &BenchReport) {
    if report.round_census.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "## Who had the CPUs during the rounds' round trips\n\n\
         A measurement whose CPUs were never idle had no wake-ups to pay.\n\n\
         | round | measurement | idle share | most CPU (s) |\n|---:|---|---:|---|"
    );
    for (round, taken) in report.round_census.iter().enumerate() {
        for c in taken {
            let top: Vec<String> = c
                .top
                .iter()
                .take(3)
                .map(|u| format!("{} {} {:.2}", u.command, u.pid, u.cpu_s))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} | {} |",
                round + 2,
                c.what,
                c.idle_share,
                top.join(", ")
            );
        }
    }
    md.push('\n');
}

fn latency(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "## pmem-fabric latency, queue depth 1\n\n| path | op | size B | client | p50 µs | p99 µs | p99.9 µs | samples | server CPU s / M ops | device CPU s / M ops |\n|---|---|---:|---|---:|---:|---:|---:|---:|---:|"
    );
    for c in &report.latency {
        let q = &c.quantiles;
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            c.path,
            c.op,
            c.size,
            if c.client_spins { "polls" } else { "sleeps" },
            q.p50_us,
            q.p99_us,
            q.p999_us,
            q.samples,
            cpu(c.server_cpu_s_per_million),
            cpu(c.device_cpu_s_per_million)
        );
    }
}

fn rates(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "\n## Throughput and bandwidth\n\n| system | op | size B | clients | depth | ops/s | MB/s | server CPU s / M ops | device CPU s / M ops | of it forwarding |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &report.rates {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {:.1} | {} | {} | {} |",
            r.system,
            r.op,
            r.size,
            r.clients,
            r.depth,
            r.ops_per_s,
            r.bytes_per_s / 1e6,
            cpu(r.server_cpu_s_per_million),
            cpu(r.device_cpu_s_per_million),
            cpu(r.device_busy_cpu_s_per_million)
        );
    }
    let _ = writeln!(
        md,
        "\n64 B rows pipeline in batches of `depth` (all answered before the next batch \
         goes out), as redis-benchmark's `-P` does; 1 MiB rows keep a sliding window of \
         `depth` in flight. A busy-polling device uses its whole CPU while anything \
         is in flight; \"of it forwarding\" leaves out the event-loop turns that polled \
         and found no event (`fabric_device_idle_poll_seconds_total`)."
    );
    if let Some(m) = &report.device_memory {
        let mib = |bytes: u64| bytes as f64 / (1 << 20) as f64;
        let _ = writeln!(
            md,
            "\nFabric device memory: {:.1} KiB resident per idle client connection, \
             {:.1} MB in all with {} connections open, their key proven and idle for {:.1} s \
             ({:.1} → {:.1} MiB; {:.1} KiB per connection just after opening, {:.1} MiB).",
            m.idle_bytes_per_connection / 1024.0,
            m.rss_idle as f64 / 1e6,
            m.connections,
            super::memory::IDLE_SETTLE.as_secs_f64(),
            mib(m.rss_before),
            mib(m.rss_idle),
            m.bytes_per_connection / 1024.0,
            mib(m.rss_after)
        );
    }
}

fn cache_policy(md: &mut String, report: &BenchReport) {
    let Some(c) = &report.cache_policy else {
        return;
    };
    let _ = writeln!(
        md,
        "\n## Server cache policy, small operations beside bulk writes\n\n\
         {} B READs and WRITEs at queue depth 1 over a {} B hot range, beside {} KiB \
         WRITEs ({} in flight, over {} MiB of the region) on another connection, all \
         through the device; medians of {} interleaved rounds. `cached`: no request asks \
         for non-temporal stores; `auto`: the bulk WRITEs do (the pool's default policy).\n\n\
         | policy | bulk non-temporal | READ p50 µs | READ p99 µs | WRITE p50 µs | WRITE p99 µs | bulk MB/s |\n\
         |---|---|---:|---:|---:|---:|---:|",
        c.small_size,
        c.hot_span,
        c.bulk_size / 1024,
        c.bulk_depth,
        c.bulk_span >> 20,
        c.rounds
    );
    for p in &c.policies {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.0} |",
            p.policy,
            if p.bulk_non_temporal { "yes" } else { "no" },
            p.read_p50_us,
            p.read_p99_us,
            p.write_p50_us,
            p.write_p99_us,
            p.bulk_bytes_per_s / 1e6
        );
    }
}

fn replication(md: &mut String, report: &BenchReport) {
    let Some(r) = &report.replication else {
        return;
    };
    let per_round = |values: &[f64]| {
        values
            .iter()
            .map(|v| format!("{v:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        md,
        "\n## A replicated region ({} copies) against one copy\n\n\
         A second bench fabric whose region has {} copies on two servers, its owner \
         device writing every copy and spreading reads over them; medians of {} \
         interleaved rounds.\n\n\
         | | one copy | {} copies |\n|---|---:|---:|\n\
         | 4 KiB WRITE_PERSIST p50 µs, queue depth 1 | {:.1} | {:.1} |\n\
         | 64 B READ ops/s, {} clients × {} pipelined | {:.0} | {:.0} |\n\n\
         Per round, replicated ÷ unreplicated: WRITE_PERSIST p50 {}; READ throughput {}.",
        r.replicas,
        r.replicas,
        r.rounds,
        r.replicas,
        r.persist_p50_us_unreplicated,
        r.persist_p50_us_replicated,
        report.plan.clients,
        report.plan.depth,
        r.read_ops_per_s_unreplicated,
        r.read_ops_per_s_replicated,
        per_round(&r.persist_p50_ratio_per_round),
        per_round(&r.read_tput_ratio_per_round)
    );
}

fn authentication(md: &mut String, report: &BenchReport) {
    let Some(a) = &report.authentication else {
        return;
    };
    let _ = writeln!(
        md,
        "\n## Authentication (`--secrets`)\n\n\
         Medians of {} interleaved rounds, two bench fabrics side by side.\n\n\
         | | without keys | with keys |\n|---|---:|---:|\n\
         | open a client connection, p50 µs ({} per round) | {:.1} | {:.1} |\n\
         | 64 B READ round trip, p50 µs | {:.1} | {:.1} |\n\n\
         Per round, with keys ÷ without (READ p50): {}.",
        a.rounds,
        a.opens_per_round,
        a.open_plain_p50_us,
        a.open_authenticated_p50_us,
        a.read_plain_p50_us,
        a.read_authenticated_p50_us,
        a.read_ratio_per_round
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

fn redis(md: &mut String, report: &BenchReport) {
    let _ = writeln!(
        md,
        "\n## redis\n\n| test | value B | clients | pipeline | ops/s | p50 µs | p99 µs | server CPU s / M ops |\n|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in &report.redis {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {} |",
            r.test,
            r.value_size,
            r.clients,
            r.pipeline,
            r.ops_per_s,
            r.latency.p50_us,
            r.latency.p99_us,
            cpu(r.server_cpu_s_per_million)
        );
    }
    let _ = writeln!(
        md,
        "\nThe last redis row is `appendonly yes`, `appendfsync always`, its files on the same filesystem as the region files.\n\n![latency CDF](latency_cdf.svg)\n\n![throughput against clients](throughput_vs_clients.svg)"
    );
}
