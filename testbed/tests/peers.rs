//! The floors and peers of `testbed bench` (`testbed::bench::peers`) with the
//! real tools from the distribution's packages: sockperf, iperf3,
//! redis-server and redis-benchmark, which `scripts/test.sh` installs (a
//! test fails, never skips, when they are missing). Then every
//! output parser on outputs captured from the real tools on a 2-core Debian
//! 12 machine (sockperf 3.7, iperf3 3.12, redis 7.0.15).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use testbed::bench::peers::{
    self, PeerError, Quantiles, RedisConfig, RedisServer, TOOLS, cpu_seconds, iperf3_bandwidth,
    listening_inodes, missing_tools, parse_iperf3_json, parse_proc_stat, parse_redis_benchmark,
    parse_sockperf, parse_sockperf_full_log, parse_vm_rss, redis_benchmark, require_tools,
    resident_bytes, sockperf_rtt, sockperf_rtt_pinned, sockperf_rtt_run, sockperf_rtt_spinning,
};
use testbed::report::LatencyHistogram;

/// The tool tests run one at a time: on two cores, two benchmarks at once
/// would measure each other, and each checks that it left no server behind.
static ONE_TOOL_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Takes the tool lock and checks that the tools are installed.
fn tools() -> MutexGuard<'static, ()> {
    let guard = ONE_TOOL_AT_A_TIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Err(e) = require_tools(TOOLS) {
        panic!("the bench tools must be installed (scripts/test.sh does it): {e}");
    }
    guard
}

/// This process's children that are bench tools, running or unreaped.
fn tool_children() -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter(|stat| {
            let parent = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1).map(str::to_owned));
            parent.as_deref() == Some(me.as_str())
        })
        .filter(|stat| {
            ["sockperf", "iperf3", "redis-server", "redis-benchmark"]
                .iter()
                .any(|name| stat.contains(&format!("({name})")))
        })
        .collect()
}

fn assert_no_tool_left() {
    let left = tool_children();
    assert!(left.is_empty(), "servers left behind: {left:?}");
}

/// Files under `dir` whose name contains `.aof`, with their sizes.
fn aof_files(dir: &Path) -> Vec<(String, u64)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
    {
        let path = entry.path();
        if path.is_dir() {
            found.extend(aof_files(&path));
        } else if path.to_string_lossy().contains(".aof") {
            let size = entry.metadata().expect("metadata").len();
            found.push((path.display().to_string(), size));
        }
    }
    found
}

fn sane(q: &Quantiles, what: &str) {
    assert!(q.p50_us > 0.0, "{what}: {q:?}");
    assert!(q.p99_us >= q.p50_us, "{what}: {q:?}");
    assert!(q.p999_us >= q.p99_us, "{what}: {q:?}");
    assert!(q.max_us >= q.p999_us, "{what}: {q:?}");
    assert!(q.samples > 0, "{what}: {q:?}");
}

// ---------------------------------------------------------------------------
// The real tools.

#[test]
fn tools_are_installed_or_installable() {
    let _tools = tools();
    for (program, _) in TOOLS {
        assert!(
            missing_tools(&[(program, "unused")]).is_empty(),
            "{program} not on PATH"
        );
    }
}

#[test]
fn sockperf_64_byte_round_trips() {
    let _tools = tools();
    let started = Instant::now();
    let run = sockperf_rtt_run(64, Duration::from_secs(1)).expect("sockperf");
    let took = started.elapsed();
    eprintln!("sockperf 64 B: {:?} in {took:.1?}", run.quantiles);
    let q = run.quantiles;
    sane(&q, "sockperf");
    assert!(run.avg_us > 0.0);
    assert_eq!(run.msg_size, 64);
    // The full log holds exactly the observations the summary counts.
    assert_eq!(run.histogram.count(), q.samples);
    let p50 = run.histogram.quantile(0.5) as f64;
    assert!(
        (p50 - q.p50_us).abs() <= q.p50_us * 0.05 + 1.0,
        "{p50} vs {q:?}"
    );
    assert_no_tool_left();
}

/// The command lines of this process's sockperf children now.
fn sockperf_command_lines() -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .filter_map(Result::ok)
        .filter(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
                stat.contains("(sockperf)")
                    && stat
                        .rsplit_once(')')
                        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                        == Some(me.as_str())
            })
        })
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes).replace('\0', " "))
        .collect()
}

#[test]
fn sockperf_with_both_ends_polling() {
    let _tools = tools();
    // Watch the tool's processes while it runs: both ends get --nonblocked.
    let done = std::sync::atomic::AtomicBool::new(false);
    let (run, seen) = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen = std::collections::BTreeSet::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                seen.extend(sockperf_command_lines());
                std::thread::sleep(Duration::from_millis(50));
            }
            seen
        });
        let run = sockperf_rtt_spinning(64, Duration::from_secs(1));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (run, watcher.join().expect("watcher"))
    });
    let run = run.expect("sockperf --nonblocked");
    eprintln!("sockperf 64 B, both ends polling: {:?}", run.quantiles);
    sane(&run.quantiles, "spinning sockperf");
    assert_eq!(run.histogram.count(), run.quantiles.samples);
    for end in ["sockperf server", "sockperf ping-pong"] {
        assert!(
            seen.iter()
                .any(|line| line.starts_with(end) && line.contains("--nonblocked")),
            "{end} without --nonblocked: {seen:?}"
        );
    }
    assert_no_tool_left();
}

#[test]
fn sockperf_4096_bytes_through_the_short_form() {
    let _tools = tools();
    let q = sockperf_rtt(4096, Duration::from_millis(300)).expect("sockperf");
    sane(&q, "sockperf 4096");
    assert_no_tool_left();
}

#[test]
fn sockperf_pinned_to_one_cpu() {
    let _tools = tools();
    let run = sockperf_rtt_pinned(64, Duration::from_secs(1), 0, 0).expect("sockperf on CPU 0");
    eprintln!("sockperf 64 B, both on CPU 0: {:?}", run.quantiles);
    sane(&run.quantiles, "pinned sockperf");
    assert_eq!(run.histogram.count(), run.quantiles.samples);
    assert_no_tool_left();
}

#[test]
fn iperf3_one_stream_measures_a_bandwidth() {
    let _tools = tools();
    let started = Instant::now();
    let bytes_per_s = iperf3_bandwidth(Duration::from_secs(1)).expect("iperf3");
    let took = started.elapsed();
    eprintln!("iperf3: {:.2} GB/s in {took:.1?}", bytes_per_s / 1e9);
    assert!(
        bytes_per_s.is_finite() && bytes_per_s > 0.0,
        "{bytes_per_s} B/s"
    );
    assert_no_tool_left();
}

#[test]
fn redis_get_and_set_pipelined() {
    let _tools = tools();
    let dir = tempfile::tempdir().expect("temp dir");
    let server = RedisServer::start(&RedisConfig {
        aof_always: false,
        dir: dir.path().join("redis"),
    })
    .expect("redis-server");
    assert!(server.port() > 0);
    assert!(!server.aof_always());
    assert_eq!(server.dir(), dir.path().join("redis"));
    let cpu_before = cpu_seconds(server.pid()).expect("cpu");
    for test in ["SET", "get"] {
        let started = Instant::now();
        let r = redis_benchmark(&server, test, 64, 50, 16, 100_000).expect("redis-benchmark");
        eprintln!(
            "redis {}: {:.0} ops/s, {:?} in {:.1?}",
            r.test,
            r.ops_per_s,
            r.latency,
            started.elapsed()
        );
        assert_eq!(r.test, test.to_ascii_uppercase());
        assert_eq!((r.clients, r.pipeline, r.value_size), (50, 16, 64));
        assert!(r.ops_per_s.is_finite() && r.ops_per_s > 0.0, "{r:?}");
        sane(&r.latency, test);
        assert_eq!(r.latency.samples, 100_000);
        assert_eq!(r.histogram.count(), 100_000);
        // The JSON form round-trips.
        let json = serde_json::to_string(&r).expect("json");
        let back: peers::RedisResult = serde_json::from_str(&json).expect("parse json");
        let close = |a: f64, b: f64| (a - b).abs() <= b.abs() * 1e-12;
        assert!(close(back.latency.p50_us, r.latency.p50_us), "{back:?}");
        assert!(close(back.latency.p999_us, r.latency.p999_us), "{back:?}");
        assert_eq!(back.latency.samples, r.latency.samples);
        assert_eq!(back.histogram, r.histogram);
    }
    let cpu_after = cpu_seconds(server.pid()).expect("cpu");
    assert!(cpu_after > cpu_before, "{cpu_before} -> {cpu_after}");
    assert!(matches!(
        redis_benchmark(&server, "INCR", 64, 1, 1, 10),
        Err(PeerError::InvalidArgument(_))
    ));
    assert!(matches!(
        redis_benchmark(&server, "GET", 64, 0, 1, 10),
        Err(PeerError::InvalidArgument(_))
    ));
    let pid = server.pid();
    drop(server);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "redis {pid} still there"
    );
    assert_no_tool_left();
    // A server that is gone fails fast instead of hanging redis-benchmark.
}

#[test]
fn redis_aof_always_set_4k_one_client() {
    let _tools = tools();
    let dir = tempfile::tempdir().expect("temp dir");
    let server = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: dir.path().to_owned(),
    })
    .expect("redis-server");
    assert!(server.aof_always());
    let started = Instant::now();
    let r = redis_benchmark(&server, "SET", 4096, 1, 1, 1_000).expect("redis-benchmark");
    eprintln!(
        "redis-aof SET 4 KiB: {:.0} ops/s, {:?} in {:.1?}",
        r.ops_per_s,
        r.latency,
        started.elapsed()
    );
    assert!(r.latency.p50_us > 0.0, "{r:?}");
    sane(&r.latency, "aof SET");
    assert_eq!((r.clients, r.pipeline, r.value_size), (1, 1, 4096));
    let files = aof_files(dir.path());
    let bytes: u64 = files.iter().map(|(_, size)| size).sum();
    assert!(bytes >= 1_000 * 4096, "append-only files: {files:?}");
    drop(server);
    assert_no_tool_left();
}

#[test]
fn redis_that_cannot_start_names_the_problem() {
    let _tools = tools();
    let dir = tempfile::tempdir().expect("temp dir");
    // A file where the folder should be.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let err = RedisServer::start(&RedisConfig {
        aof_always: true,
        dir: file,
    })
    .expect_err("redis in a file");
    assert!(matches!(err, PeerError::Io(_)), "{err}");
    assert_no_tool_left();
}

#[test]
fn cpu_seconds_of_a_busy_child_grows() {
    let spawned = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn sh");
    let before = cpu_seconds(child.id()).expect("cpu before");
    // However little CPU the machine gives it, a spinning child's grows (the
    // deadline only bounds a hang).
    let deadline = Instant::now() + Duration::from_secs(60);
    let after = loop {
        let now = cpu_seconds(child.id()).expect("cpu after");
        if now > before || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let wall = spawned.elapsed().as_secs_f64();
    child.kill().expect("kill");
    child.wait().expect("wait");
    assert!(after > before, "{before} -> {after}");
    // One single-threaded process cannot use more CPU than wall time
    // (two ticks of /proc allowed).
    assert!(after <= wall + 0.02, "{after} s of CPU in {wall} s");
    assert!(
        cpu_seconds(child.id()).is_err(),
        "a reaped child has no /proc entry"
    );
}

// ---------------------------------------------------------------------------
// Installation errors.

#[test]
fn a_missing_tool_is_named_with_its_package() {
    let tools = [
        ("sh", "dash"),
        ("no-such-program-pmem-fabric", "no-such-package-pmem-fabric"),
    ];
    assert_eq!(
        missing_tools(&tools),
        vec![("no-such-program-pmem-fabric", "no-such-package-pmem-fabric")]
    );
    assert!(require_tools(&[("sh", "dash")]).is_ok());
    assert!(require_tools(&[]).is_ok());
    let text = require_tools(&[
        ("sh", "dash"),
        ("no-such-benchmark-pmem-fabric", "redis-tools"),
        ("no-such-server-pmem-fabric", "redis-server"),
    ])
    .expect_err("missing")
    .to_string();
    for part in [
        "`no-such-benchmark-pmem-fabric`",
        "`redis-tools`",
        "apt-get install -y --no-install-recommends redis-tools",
        "scripts/ensure-packages.sh no-such-benchmark-pmem-fabric:redis-tools",
        "also missing: `no-such-server-pmem-fabric` (redis-server)",
    ] {
        assert!(text.contains(part), "{part:?} not in {text:?}");
    }
}

// ---------------------------------------------------------------------------
// The parsers, on captured outputs.

#[test]
fn parses_sockperf_summary() {
    let stats = parse_sockperf(SOCKPERF_64).expect("parse");
    assert_eq!(
        stats.quantiles,
        Quantiles {
            p50_us: 74.750,
            p99_us: 151.344,
            p999_us: 545.538,
            max_us: 3809.097,
            samples: 19743,
        }
    );
    assert_eq!(stats.avg_us, 78.466);
    // Half round trips (no --full-rtt) are refused rather than halved.
    let half = SOCKPERF_64.replace("Round trip is", "Latency is");
    assert!(matches!(
        parse_sockperf(&half),
        Err(PeerError::Parse { .. })
    ));
    // An error run has no figures.
    let refused = "sockperf: \u{1b}[2;35m== version #3.7-no.git == \u{1b}[0m\n\
                   sockperf: ERROR: Can`t connect socket (errno=111 Connection refused)\n";
    let err = parse_sockperf(refused).expect_err("no figures");
    assert!(err.to_string().contains("Connection refused"), "{err}");
}

#[test]
fn parses_sockperf_full_log() {
    let h = parse_sockperf_full_log(SOCKPERF_FULL_LOG).expect("parse");
    assert_eq!(h.count(), 9);
    assert_eq!(h.min(), 55); // 55.492 µs
    assert_eq!(h.max(), 61); // 60.990 µs
    assert_eq!(h.quantile(0.5), 59);
    assert!(parse_sockperf_full_log("no table here\n").is_err());
}

#[test]
fn parses_iperf3_json() {
    let bytes_per_s = parse_iperf3_json(IPERF3_JSON).expect("parse");
    assert_eq!(bytes_per_s, 15_650_294_562.775806 / 8.0);
    let refused = r#"{
	"start":	{
		"connected":	[],
		"version":	"iperf 3.12",
		"system_info":	"Linux vm 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0 x86_64"
	},
	"intervals":	[],
	"end":	{
	},
	"error":	"unable to connect to server: Connection refused"
}"#;
    let err = parse_iperf3_json(refused).expect_err("error member");
    assert!(matches!(err, PeerError::Failed { .. }), "{err}");
    assert!(err.to_string().contains("Connection refused"), "{err}");
    assert!(matches!(
        parse_iperf3_json("iperf3: error - unable to connect"),
        Err(PeerError::Parse { .. })
    ));
}

/// Parses `output` as redis-benchmark's run of `test` and checks its
/// throughput, its latency summary ([p50, p99, p99.9, max] µs and the
/// number of samples) and that its histogram holds every sample up to the
/// maximum.
fn assert_redis_parses(
    test: &str,
    output: &str,
    ops_per_s: f64,
    [p50_us, p99_us, p999_us, max_us]: [f64; 4],
    samples: u64,
) -> peers::RedisFigures {
    let r = parse_redis_benchmark(test, output).expect("parse");
    assert_eq!(r.ops_per_s, ops_per_s);
    let latency = Quantiles {
        p50_us,
        p99_us,
        p999_us,
        max_us,
        samples,
    };
    assert_eq!(r.latency, latency);
    assert_eq!(r.histogram.count(), samples);
    assert_eq!(r.histogram.max() as f64, max_us);
    r
}

#[test]
fn parses_redis_benchmark_get() {
    let latency = [1879.0, 3895.0, 4543.0, 4943.0];
    let r = assert_redis_parses("GET", REDIS_GET, 367_647.03, latency, 200_000);
    assert_eq!(r.histogram.min(), 423);
    let p50 = r.histogram.quantile(0.5) as f64;
    assert!((1850.0..=1920.0).contains(&p50), "{p50}");
    // Another test's output does not pass for this one.
    assert!(matches!(
        parse_redis_benchmark("SET", REDIS_GET),
        Err(PeerError::Parse { .. })
    ));
}

#[test]
fn parses_redis_benchmark_aof_set() {
    let latency = [319.0, 687.0, 4799.0, 5471.0];
    assert_redis_parses("set", REDIS_AOF_SET, 2873.56, latency, 2000);
    // Cut before the summary: no throughput.
    let cut = &REDIS_AOF_SET[..REDIS_AOF_SET.find("Summary:").expect("summary")];
    let err = parse_redis_benchmark("SET", cut).expect_err("no summary");
    assert!(err.to_string().contains("throughput summary"), "{err}");
}

#[test]
fn parses_one_test_of_several() {
    let both = format!("{REDIS_GET}{REDIS_AOF_SET}");
    let get = parse_redis_benchmark("GET", &both).expect("GET");
    assert_eq!(get.latency.samples, 200_000);
    assert_eq!(get.latency.max_us, 4943.0);
    assert_eq!(get.histogram.max(), 4943);
    let set = parse_redis_benchmark("SET", &both).expect("SET");
    assert_eq!(set.ops_per_s, 2873.56);
    assert_eq!(set.histogram.count(), 2000);
}

#[test]
fn parses_proc_stat() {
    // `cargo`: utime 7, stime 6 ticks.
    let cargo = "9521 (cargo) S 9520 9517 975 0 -1 4194304 9371 28980 6 5 7 6 75 13 20 0 4 0 \
                 504319 275554304 13432 18446744073709551615 94790941523008 94790965748464 \
                 140730526203520 0 0 0 0 4096 1600 0 0 0 17 1 0 0 0 0 0 94790966875696 \
                 94790966945232 94791842873344 140730526206312 140730526206406 140730526206406 \
                 140730526207925 0\n";
    assert_eq!(parse_proc_stat(cargo, 100.0), Some(0.13));
    // A program named `busy) (x`: the name ends at the last parenthesis.
    let odd = "9622 (busy) (x) S 1 9618 25476 0 -1 4194304 137 0 0 0 3 2 0 0 20 0 1 0 504877 \
               2990080 444 18446744073709551615 94538391064576 94538391082505 140722444415952 \
               0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 94538391096592 94538391097856 94538440679424 \
               140722444421860 140722444421876 140722444421876 140722444423146 0\n";
    assert_eq!(parse_proc_stat(odd, 100.0), Some(0.05));
    assert_eq!(parse_proc_stat("garbage", 100.0), None);
    assert_eq!(parse_proc_stat("1 (x) S 1 2", 100.0), None);
}

#[test]
fn parses_vm_rss() {
    let status = "Name:\tfabric-device\nVmPeak:\t  10000 kB\nVmRSS:\t    5432 kB\nThreads:\t2\n";
    assert_eq!(parse_vm_rss(status), Some(5432 * 1024));
    assert_eq!(parse_vm_rss("VmRSS:\t5432 MB\n"), None);
    assert_eq!(parse_vm_rss("VmRSS:\n"), None);
    assert_eq!(
        parse_vm_rss("Name:\tkthreadd\n"),
        None,
        "kernel threads have no VmRSS"
    );
    // This process has some resident memory; a process that does not exist
    // is an error that names the file.
    assert!(resident_bytes(std::process::id()).expect("own VmRSS") > 0);
    let missing = resident_bytes(u32::MAX)
        .expect_err("no such process")
        .to_string();
    assert!(missing.contains("/proc/4294967295/status"), "{missing}");
}

#[test]
fn finds_listening_sockets_in_proc_net_tcp() {
    let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:75AB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 395122 1 000000009f939caa 100 0 0 10 0
   1: 0100007F:76BC 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 395127 1 000000007c8653f4 100 0 0 10 0
   2: 0100007F:75AB 0100007F:8A3E 01 00000000:00000000 00:00000000 00000000     0        0 395130 1 000000007c8653f5 20 4 30 10 -1
";
    assert_eq!(listening_inodes(tcp, 30123), vec![395122]);
    assert_eq!(listening_inodes(tcp, 30396), vec![395127]);
    assert!(listening_inodes(tcp, 35390).is_empty());
}

#[test]
fn quantiles_of_a_histogram() {
    let mut h = LatencyHistogram::new();
    for us in 1..=1000 {
        h.record(us);
    }
    let q = Quantiles::from_histogram(&h);
    assert_eq!(q.samples, 1000);
    assert_eq!(q.max_us, 1000.0);
    assert!((q.p50_us - 500.0).abs() <= 8.0, "{q:?}");
    assert!((q.p99_us - 990.0).abs() <= 16.0, "{q:?}");
}

// ---------------------------------------------------------------------------
// Captured outputs.

/// sockperf 3.7 `ping-pong --tcp -m 64 -t 2 --full-rtt` on this machine (colours included).
const SOCKPERF_64: &str = include_str!("captures/sockperf-64.txt");

/// The head of a `--full-log` file of sockperf 3.7 (`-m 64 -t 1 --full-rtt`), cut after 9 samples.
const SOCKPERF_FULL_LOG: &str = include_str!("captures/sockperf-full-log.txt");

/// `iperf3 -c 127.0.0.1 -t 1 -J` (3.12) on this machine.
const IPERF3_JSON: &str = include_str!("captures/iperf3.json");

/// `redis-benchmark -t get -d 64 -c 50 -P 16 -n 200000 -r 100000` (7.0.15), progress lines and all.
const REDIS_GET: &str = include_str!("captures/redis-benchmark-get.txt");

/// `redis-benchmark -t set -d 4096 -c 1 -P 1 -n 2000 -r 10000` against `appendfsync always` (7.0.15).
const REDIS_AOF_SET: &str = include_str!("captures/redis-benchmark-aof-set.txt");
