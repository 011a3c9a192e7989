use std::collections::BTreeSet;
use std::time::Duration;

use super::*;

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn timeline(bucket_ms: u64, completions: &[u64]) -> Timeline {
    Timeline {
        bucket_ms,
        completions: completions.to_vec(),
        errors: Vec::new(),
    }
}

fn stats(latencies_us: impl IntoIterator<Item = u64>, errors: u64, bytes_each: u64) -> OpStats {
    let mut s = OpStats::default();
    for us in latencies_us {
        s.record_ok(Duration::from_micros(us), bytes_each);
    }
    s.errors = errors;
    s
}

/// A report like a chaos run's: several operations, a dip in the timeline,
/// faults (one past the end of the data), a failed verification with more
/// mismatches than are kept, and text that needs escaping.
fn sample_report() -> RunReport {
    let mut ops = BTreeMap::new();
    ops.insert(
        "READ".to_owned(),
        stats((1..=2000).map(|i| 20 + i % 180), 3, 64),
    );
    ops.insert(
        "WRITE_PERSIST".to_owned(),
        stats((1..=1000).map(|i| 50 + i * 7), 5, 4096),
    );
    ops.insert("FETCH_ADD".to_owned(), stats([33, 35, 40, 90_000], 0, 8));
    ops.insert("CUSTOM<&>".to_owned(), stats([1_500_000], 1, 0));

    let mut completions = vec![100u64; 50];
    for c in &mut completions[20..24] {
        *c = 0;
    }
    completions[24] = 40;
    let mut errors = vec![0u64; 50];
    errors[20] = 7;
    errors[21] = 2;

    let mut verification = Verification {
        keys_checked: 1234,
        counters_checked: 16,
        ..Verification::default()
    };
    for i in 0..25 {
        verification.push_mismatch(format!("key {i}: expected v3, read v2 <stale> & \"old\""));
    }

    let mut report = RunReport {
        run_id: make_run_id(1_795_313_700_000, "chaos"),
        command: "chaos".to_owned(),
        topology: crate::DEFAULT_TOPOLOGY_NAME.to_owned(),
        workload: "mixed".to_owned(),
        clients: vec!["c1".to_owned(), "c2".to_owned()],
        started_unix_ms: 1_795_313_700_000,
        duration_s: 5.0,
        ops,
        timeline: Timeline {
            bucket_ms: 100,
            completions,
            errors,
        },
        faults: vec![
            FaultRecord {
                at_s: 2.0,
                kind: "kill-fabric".to_owned(),
                target: "fabric A".to_owned(),
                restored_at_s: Some(2.4),
                recovery_ms: None,
                stall_ms: None,
                errors_seen: 9,
            },
            FaultRecord {
                at_s: 9.5,
                kind: "cut-link".to_owned(),
                target: "c1/rnic0 <-> A | s0".to_owned(),
                restored_at_s: Some(11.0),
                recovery_ms: None,
                stall_ms: None,
                errors_seen: 0,
            },
        ],
        verification,
        notes: vec![
            "metrics at http://127.0.0.1:9100/metrics".to_owned(),
            "topology <embedded> & friends".to_owned(),
        ],
        roce: None,
        ..RunReport::default()
    };
    report.fill_recovery();
    report
}

// ---------------------------------------------------------------------------
// Model

#[test]
fn totals_and_rate() {
    let r = sample_report();
    assert_eq!(r.ops_total(), 2000 + 1000 + 4 + 1);
    assert_eq!(r.errors_total(), 3 + 5 + 1);
    assert_eq!(r.bytes_total(), 2000 * 64 + 1000 * 4096 + 4 * 8);
    assert!((r.ops_per_s() - 3005.0 / 5.0).abs() < 1e-9);
    assert_eq!(RunReport::default().ops_per_s(), 0.0);
    let all = r.all_ops();
    assert_eq!((all.count, all.errors), (3005, 9));
    // HdrHistogram's 3 significant digits.
    assert!(all.latency.max().abs_diff(1_500_000) <= 1_500);
    let names: Vec<&str> = r.ops_in_order().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["READ", "WRITE_PERSIST", "FETCH_ADD", "CUSTOM<&>"]);
}

#[test]
fn op_stats_merge_adds_everything() {
    let mut a = stats([10, 20], 1, 100);
    let b = stats([30], 2, 50);
    a.merge(&b);
    assert_eq!((a.count, a.errors, a.bytes), (3, 3, 250));
    assert_eq!(a.latency, stats([10, 20, 30], 0, 0).latency);

    let mut report = RunReport::default();
    let mut worker = BTreeMap::new();
    worker.insert("READ".to_owned(), b.clone());
    report.merge_ops(&worker);
    report.merge_ops(&worker);
    assert_eq!(report.ops["READ"].count, 2);
    assert_eq!(report.ops["READ"].errors, 4);
}

#[test]
fn timeline_records_into_buckets() {
    let mut t = Timeline::new(100);
    t.record(ms(0), true);
    t.record(ms(99), true);
    t.record(ms(100), true);
    t.record(ms(350), false);
    t.add_completions(ms(250), 5);
    assert_eq!(t.completions, [2, 1, 5]);
    assert_eq!(t.errors, [0, 0, 0, 1]);
    assert_eq!(t.len(), 4);
    assert!((t.span_s() - 0.4).abs() < 1e-12);
    assert_eq!(Timeline::new(0).bucket_ms, 1);
    assert_eq!(Timeline::default().bucket_ms, DEFAULT_BUCKET_MS);
}

#[test]
fn timeline_merge_adds_elementwise_and_extends() {
    let mut a = Timeline {
        bucket_ms: 100,
        completions: vec![1, 2, 3],
        errors: vec![1],
    };
    let b = Timeline {
        bucket_ms: 100,
        completions: vec![10, 20, 30, 40, 50],
        errors: vec![0, 0, 5],
    };
    a.merge(&b);
    assert_eq!(a.completions, [11, 22, 33, 40, 50]);
    assert_eq!(a.errors, [1, 0, 5]);

    // Merging into a shorter one the other way round gives the same result.
    let mut c = b.clone();
    c.merge(&Timeline {
        bucket_ms: 100,
        completions: vec![1, 2, 3],
        errors: vec![1],
    });
    assert_eq!(c, a);

    // An empty timeline takes the other's width.
    let mut e = Timeline::new(1000);
    e.merge(&b);
    assert_eq!(e, b);

    // Different widths: each bucket lands where it starts.
    let mut coarse = timeline(200, &[1, 1]);
    coarse.merge(&timeline(100, &[1, 2, 3, 4, 5]));
    assert_eq!(coarse.completions, [4, 8, 5]);
}

#[test]
fn recovery_is_first_bucket_back_to_half_the_prefault_average() {
    // 10 buckets at 100 before the fault (average 100, threshold 50), then a
    // stall, a bucket at 49 (not enough), one at 50 (enough).
    let mut c = vec![100u64; 10];
    c.extend([0, 0, 10, 49, 50, 100]);
    let t = timeline(100, &c);
    // Fault exactly on the edge of bucket 10: recovered at the start of
    // bucket 14 = 1.4 s.
    assert_eq!(t.recovery_after(1.0), Some(400.0));
    // Fault inside bucket 10 (at 1.05 s): the pre-fault average uses the 10
    // whole buckets before it; the search starts at bucket 11.
    let r = t.recovery_after(1.05).unwrap();
    assert!((r - 350.0).abs() < 1e-9, "{r}");
    // Decimal seconds land on the edge they name.
    assert_eq!(
        timeline(100, &[10, 10, 10, 0, 10]).recovery_after(0.3),
        Some(100.0)
    );

    // The pre-fault average counts the slow start too: 3 buckets of 20, 100,
    // 180 → average 100 → threshold 50.
    let t = timeline(100, &[20, 100, 180, 0, 49, 60]);
    assert_eq!(t.recovery_after(0.3), Some(200.0));

    // A fault with no effect recovers in the first bucket after it.
    let t = timeline(100, &[100, 100, 100, 100]);
    assert_eq!(t.recovery_after(0.2), Some(0.0));
    let r = t.recovery_after(0.25).unwrap();
    assert!((r - 50.0).abs() < 1e-9, "{r}");

    // No baseline, no recovery within the data, or nonsense input: None.
    assert_eq!(t.recovery_after(0.0), None);
    assert_eq!(t.recovery_after(0.05), None);
    assert_eq!(timeline(100, &[0, 0, 100]).recovery_after(0.2), None);
    assert_eq!(timeline(100, &[100, 100, 0, 0]).recovery_after(0.2), None);
    assert_eq!(t.recovery_after(10.0), None);
    assert_eq!(t.recovery_after(f64::NAN), None);
    assert_eq!(t.recovery_after(-1.0), None);
    assert_eq!(Timeline::default().recovery_after(1.0), None);
}

#[test]
fn fill_recovery_uses_the_timeline_and_keeps_given_values() {
    let mut r = sample_report();
    // Fault at 2.0 s: buckets 20..24 are 0, 24 has 40 (< 50), 25 is back.
    assert_eq!(r.faults[0].recovery_ms, Some(500.0));
    // Past the end of the data: unknown.
    assert_eq!(r.faults[1].recovery_ms, None);
    r.faults[0].recovery_ms = Some(123.0);
    r.fill_recovery();
    assert_eq!(r.faults[0].recovery_ms, Some(123.0));
}

#[test]
fn first_completion_and_longest_gap() {
    let t = timeline(100, &[5, 0, 0, 3, 0, 0, 0, 1, 0]);
    assert_eq!(t.first_completion_after(0.0), Some(0.0));
    assert_eq!(t.first_completion_after(0.05), Some(0.3));
    assert_eq!(t.first_completion_after(0.3), Some(0.3));
    assert_eq!(t.first_completion_after(0.75), None);
    assert_eq!(t.first_completion_after(f64::NAN), None);

    let gap = t.longest_gap_after(0.0).unwrap();
    assert!((gap.start_s - 0.4).abs() < 1e-12);
    assert_eq!(gap.duration_ms, 300.0);
    let gap = t.longest_gap_after(0.75).unwrap();
    assert!((gap.start_s - 0.8).abs() < 1e-12);
    assert_eq!(gap.duration_ms, 100.0);
    assert_eq!(timeline(100, &[1, 2]).longest_gap_after(0.0), None);
    assert_eq!(t.longest_gap_after(100.0), None);
}

#[test]
fn resample_sums_buckets_into_at_most_n_points() {
    let t = Timeline {
        bucket_ms: 10,
        completions: vec![1; 1201],
        errors: vec![],
    };
    let points = t.resample(600);
    assert!(points.len() <= 600, "{}", points.len());
    assert_eq!(points.len(), 401); // groups of 3, the last one partial
    for &(_, rate, errors) in &points {
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        assert_eq!(errors, 0.0);
    }
    assert!((points[0].0 - 0.015).abs() < 1e-12);
    assert!(timeline(10, &[]).resample(600).is_empty());
    assert_eq!(timeline(1000, &[7]).resample(600), [(0.5, 7.0, 0.0)]);
}

#[test]
fn verification_keeps_twenty_mismatches_and_counts_the_rest() {
    let mut v = Verification::default();
    for i in 0..MAX_MISMATCHES {
        v.push_mismatch(format!("m{i}"));
    }
    assert_eq!(v.mismatches.len(), MAX_MISMATCHES);
    assert_eq!(v.mismatch_count(), 20);
    v.push_mismatch("m20");
    assert_eq!(v.mismatches.last().unwrap(), "... and 1 more");
    for i in 21..100 {
        v.push_mismatch(format!("m{i}"));
    }
    assert_eq!(v.mismatches.len(), MAX_MISMATCHES + 1);
    assert_eq!(v.mismatches.last().unwrap(), "... and 80 more");
    assert_eq!(v.mismatches[19], "m19");
    assert_eq!(v.mismatch_count(), 100);
    assert_eq!(Verification::default().mismatch_count(), 0);
}

#[test]
fn checks_during_the_run_and_at_the_end_are_kept_apart_and_merged_per_client() {
    let mut worker = Verification {
        keys_checked: 3,
        reads_checked: 10,
        reads_overlapped: 2,
        reads_torn_by_overlap: 1,
        ..Verification::default()
    };
    assert!(worker.is_clean());
    worker.push_during_run("read of key 9 during the run saw bytes no write of it produced");
    assert!(!worker.is_clean());
    assert_eq!((worker.during_run_count(), worker.mismatch_count()), (1, 0));
    let mut run = Verification::default();
    run.merge(&worker, "c1: ");
    run.merge(&worker, "c2: ");
    assert_eq!(
        (run.keys_checked, run.reads_checked, run.reads_overlapped),
        (6, 20, 4)
    );
    assert_eq!(run.reads_torn_by_overlap, 2);
    assert!(run.mismatches.is_empty());
    assert_eq!(run.during_run.len(), 2);
    assert!(run.during_run[1].starts_with("c2: read of key 9"));
    for i in 0..100 {
        run.push_during_run(format!("d{i}"));
    }
    assert_eq!(run.during_run_count(), 102);
    assert_eq!(run.during_run.len(), MAX_MISMATCHES + 1);

    let md = markdown(&RunReport {
        verification: run,
        ..RunReport::default()
    });
    assert!(md.contains("During the run:"), "{md}");
    assert!(!md.contains("At the final verification:"), "{md}");
    assert!(
        md.contains("overlapping a write of their key: 4 (2 saw a mix"),
        "{md}"
    );
}

#[test]
fn a_report_from_before_the_during_run_checks_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut json: serde_json::Value = serde_json::to_value(sample_report()).unwrap();
    let v = json["verification"].as_object_mut().unwrap();
    for field in [
        "reads_checked",
        "reads_overlapped",
        "reads_torn_by_overlap",
        "during_run",
    ] {
        v.remove(field);
    }
    for field in ["parameters", "replay", "data_dir", "data_kept"] {
        json.as_object_mut().unwrap().remove(field);
    }
    fs::write(dir.path().join(JSON_FILE), json.to_string()).unwrap();
    let back = read_report(dir.path()).unwrap();
    assert_eq!(back.verification.reads_checked, 0);
    assert!(back.verification.during_run.is_empty());
    assert!(back.replay.is_empty());
}

// ---------------------------------------------------------------------------
// Files

/// A small well-formedness check: one root element, tags balance and nest,
/// attributes are quoted and unique, `&` only starts an entity, no stray `<`.
fn check_xml(doc: &str) -> Result<(), String> {
    fn check_entities(text: &str) -> Result<(), String> {
        let mut rest = text;
        while let Some(i) = rest.find('&') {
            let after = &rest[i + 1..];
            let end = after
                .find(';')
                .ok_or_else(|| format!("bare & in {text:?}"))?;
            let name = &after[..end];
            let ok = matches!(name, "amp" | "lt" | "gt" | "quot" | "apos")
                || name
                    .strip_prefix('#')
                    .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("bad entity &{name}; in {text:?}"));
            }
            rest = &after[end + 1..];
        }
        Ok(())
    }
    fn check_attributes(tag: &str, mut attrs: &str) -> Result<(), String> {
        let mut seen = Vec::new();
        loop {
            attrs = attrs.trim_start();
            if attrs.is_empty() {
                return Ok(());
            }
            let eq = attrs
                .find('=')
                .ok_or_else(|| format!("attribute without value in <{tag} {attrs}"))?;
            let name = &attrs[..eq];
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':')
            {
                return Err(format!("bad attribute name {name:?} in <{tag}>"));
            }
            if seen.contains(&name) {
                return Err(format!("duplicate attribute {name} in <{tag}>"));
            }
            seen.push(name);
            let rest = &attrs[eq + 1..];
            let quote = rest
                .chars()
                .next()
                .filter(|c| *c == '"' || *c == '\'')
                .ok_or_else(|| format!("unquoted attribute {name} in <{tag}>"))?;
            let close = rest[1..]
                .find(quote)
                .ok_or_else(|| format!("unterminated attribute {name} in <{tag}>"))?;
            let value = &rest[1..1 + close];
            if value.contains('<') {
                return Err(format!("< in attribute {name} of <{tag}>"));
            }
            check_entities(value)?;
            attrs = &rest[close + 2..];
            if !(attrs.is_empty() || attrs.starts_with(char::is_whitespace)) {
                return Err(format!("no space after attribute {name} in <{tag}>"));
            }
        }
    }

    let mut stack: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut rest = doc.trim();
    while !rest.is_empty() {
        let Some(open) = rest.find('<') else {
            if !stack.is_empty() || !rest.trim().is_empty() {
                return Err(format!("text outside the root: {rest:?}"));
            }
            break;
        };
        let text = &rest[..open];
        if stack.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        if text.contains('>') {
            return Err(format!("stray > in text {text:?}"));
        }
        check_entities(text)?;
        let close = rest[open..].find('>').ok_or("unterminated tag")? + open;
        let tag = &rest[open + 1..close];
        if tag.contains('<') {
            return Err(format!("< inside tag {tag:?}"));
        }
        if let Some(name) = tag.strip_prefix('/') {
            let top = stack
                .pop()
                .ok_or_else(|| format!("</{name}> closes nothing"))?;
            if top != name.trim() {
                return Err(format!("<{top}> closed by </{name}>"));
            }
        } else {
            let (body, self_closing) = match tag.strip_suffix('/') {
                Some(body) => (body, true),
                None => (tag, false),
            };
            let name_end = body.find(char::is_whitespace).unwrap_or(body.len());
            let name = &body[..name_end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(format!("bad tag name {name:?}"));
            }
            check_attributes(name, &body[name_end..])?;
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name);
            }
        }
        rest = &rest[close + 1..];
    }
    if !stack.is_empty() {
        return Err(format!("unclosed elements {stack:?}"));
    }
    if roots != 1 {
        return Err(format!("{roots} root elements"));
    }
    Ok(())
}

#[test]
fn the_xml_checker_catches_what_it_should() {
    assert!(check_xml(r#"<svg a="1"><g><text>a &amp; b</text></g><line/></svg>"#).is_ok());
    for bad in [
        "<svg><g></svg>",
        "<svg></g></svg>",
        "<svg><text>a & b</text></svg>",
        "<svg><text>a < b</text></svg>",
        r#"<svg a="1" a="2"></svg>"#,
        "<svg a=1></svg>",
        r#"<svg a="x<y"></svg>"#,
        "<svg></svg><svg></svg>",
        "<svg>",
    ] {
        assert!(check_xml(bad).is_err(), "{bad}");
    }
}

fn check_svg(svg: &str) {
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(svg.contains(r#"viewBox="0 0 800 400""#));
    if let Err(e) = check_xml(svg) {
        panic!("malformed SVG: {e}\n{svg}");
    }
    // No NaN or infinite coordinates sneak in.
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// Series curves are drawn 2 px wide (grid lines 1 px, legend swatches 3 px).
const CURVE: &str = r#"stroke-width="2""#;

/// The distinct x positions of the dashed fault markers.
fn fault_markers(svg: &str) -> BTreeSet<&str> {
    svg.lines()
        .filter(|l| l.contains(r##"stroke="#B22222" stroke-width="2""##))
        .filter_map(|l| l.split("points=\"").nth(1)?.split(',').next())
        .collect()
}

/// Numbers in two JSON values are equal within a relative 1e-12; everything
/// else exactly.
fn assert_json_close(a: &serde_json::Value, b: &serde_json::Value, path: &str) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x.is_f64() || y.is_f64() {
                let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                assert!(
                    (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
                    "{path}: {x} != {y}"
                );
            } else {
                assert_eq!(x, y, "{path}");
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{path}");
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                assert_json_close(x, y, &format!("{path}[{i}]"));
            }
        }
        (Value::Object(x), Value::Object(y)) => {
            assert_eq!(
                x.keys().collect::<Vec<_>>(),
                y.keys().collect::<Vec<_>>(),
                "{path}"
            );
            for (k, v) in x {
                assert_json_close(v, &y[k], &format!("{path}.{k}"));
            }
        }
        _ => assert_eq!(a, b, "{path}"),
    }
}

#[test]
fn write_report_writes_all_files() {
    let dir = tempfile::tempdir().unwrap();
    let report = sample_report();
    let target = dir.path().join("reports").join(&report.run_id);
    let files = write_report(&target, &report).unwrap();
    assert_eq!(files.dir, target);
    for f in [
        &files.json,
        &files.markdown,
        &files.latency_cdf,
        &files.throughput,
    ] {
        assert!(f.is_file(), "{} missing", f.display());
        assert_eq!(f.parent().unwrap(), target);
    }
    assert_eq!(files.json.file_name().unwrap(), "report.json");
    assert_eq!(files.markdown.file_name().unwrap(), "report.md");

    // JSON: round trip to an equal report.
    let text = fs::read_to_string(&files.json).unwrap();
    let back = read_report(&files.json).unwrap();
    assert_json_close(
        &serde_json::to_value(&report).unwrap(),
        &serde_json::to_value(&back).unwrap(),
        "report",
    );
    assert_eq!(back.ops, report.ops);
    assert_eq!(back.timeline, report.timeline);
    assert_eq!(back.verification, report.verification);
    assert_eq!(back.run_id, report.run_id);
    assert_eq!(back.faults.len(), report.faults.len());
    assert_eq!(read_report(&target).unwrap().ops, report.ops);
    assert!(text.contains("\"WRITE_PERSIST\""));

    // SVGs: well formed, one curve per operation with samples.
    let cdf = fs::read_to_string(&files.latency_cdf).unwrap();
    check_svg(&cdf);
    assert_eq!(count(&cdf, CURVE), 4);
    for name in ["READ", "WRITE_PERSIST", "FETCH_ADD", "CUSTOM&lt;&amp;&gt;"] {
        assert!(cdf.contains(name), "{name} missing from the legend");
    }
    assert!(cdf.contains("1 s") && cdf.contains("10 µs"), "decade ticks");
    assert!(cdf.contains("latency (log scale)"), "axis label");
    assert!(!cdf.contains("no data"));

    let tp = fs::read_to_string(&files.throughput).unwrap();
    check_svg(&tp);
    // Completions and errors, each in the legend.
    assert_eq!(count(&tp, r##"stroke="#1F77B4" stroke-width="2""##), 1);
    assert_eq!(count(&tp, r##"stroke="#D62728" stroke-width="2""##), 1);
    assert!(tp.contains("completions/s") && tp.contains("errors/s"));
    assert!(tp.contains("operations per second"), "axis label");
    assert_eq!(fault_markers(&tp).len(), 2, "one marker per fault");
    assert_eq!(
        count(&tp, r##"fill="#F4A261""##),
        2,
        "one span per restored fault"
    );
    assert!(tp.contains("kill-fabric fabric A (recovery 500 ms)"));
    assert!(tp.contains("c1/rnic0 &lt;-&gt; A | s0"));

    // Markdown: summary, table rows, faults, verification, notes, plots.
    let md = fs::read_to_string(&files.markdown).unwrap();
    assert!(md.starts_with("# Run report `20261122-021500-chaos`"));
    assert!(md.contains(
        "| operation | count | errors | p50 µs | p99 µs | p99.9 µs | max µs | MB moved |"
    ));
    let read = &report.ops["READ"].latency;
    let row = format!(
        "| `READ` | 2000 | 3 | {} | {} | {} | {} | 0.13 |",
        read.quantile(0.5),
        read.quantile(0.99),
        read.quantile(0.999),
        read.max()
    );
    assert!(md.contains(&row), "{row} missing from\n{md}");
    assert!(md.contains("| `FETCH_ADD` | 4 | 0 | "));
    assert!(md.contains("| `all` | 3005 | 9 | "));
    assert!(
        md.contains("| 1 | 2.00 | `kill-fabric` | `fabric A` | 2.40 | 500 | 400 | 9 |"),
        "{md}"
    );
    assert!(
        md.contains(r"| 2 | 9.50 | `cut-link` | `c1/rnic0 <-> A \| s0` | 11.00 | — | — | 0 |"),
        "{md}"
    );
    assert!(md.contains("3005 operations (601 ops/s"), "{md}");
    assert!(md.contains("the application saw 9 errors"), "{md}");
    assert!(md.contains("Verification **FAILED**"));
    assert!(md.contains("25 mismatches"));
    assert!(md.contains("... and 5 more"));
    assert!(md.contains("`<embedded configs/default.toml>`"));
    assert!(md.contains("- topology &lt;embedded&gt; &amp; friends"));
    assert!(md.contains("(latency_cdf.svg)") && md.contains("(throughput.svg)"));
    assert!(md.contains("(latency_tail.svg)"));
    check_svg(&fs::read_to_string(&files.latency_tail).unwrap());
    assert!(md.contains("2026-11-22 02:15:00 UTC"));

    // Writing again over the same folder works.
    write_report(&target, &report).unwrap();
}

#[test]
fn empty_report_still_renders() {
    let dir = tempfile::tempdir().unwrap();
    let report = RunReport {
        run_id: "empty".to_owned(),
        ..RunReport::default()
    };
    let files = write_report(dir.path(), &report).unwrap();
    for svg in [&files.latency_cdf, &files.throughput] {
        let svg = fs::read_to_string(svg).unwrap();
        check_svg(&svg);
        assert!(svg.contains("no data"));
        assert_eq!(count(&svg, CURVE), 0);
    }
    let md = fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains("No operations were recorded."));
    assert!(md.contains("No faults were injected."));
    assert_eq!(read_report(dir.path()).unwrap(), report);
    assert_eq!(summary_table(&report), "  (no operations recorded)\n");
}

#[test]
fn single_points_and_odd_values_render() {
    let dir = tempfile::tempdir().unwrap();
    let mut ops = BTreeMap::new();
    ops.insert("READ".to_owned(), stats([0], 0, 1));
    ops.insert("WRITE".to_owned(), stats([], 4, 0));
    let report = RunReport {
        run_id: "one".to_owned(),
        duration_s: f64::NAN,
        ops,
        timeline: timeline(1000, &[1]),
        faults: vec![
            FaultRecord {
                at_s: 500.0,
                kind: "restart-all".to_owned(),
                target: String::new(),
                restored_at_s: Some(400.0),
                ..FaultRecord::default()
            },
            FaultRecord {
                at_s: f64::NAN,
                kind: "kill-server".to_owned(),
                ..FaultRecord::default()
            },
        ],
        ..RunReport::default()
    };
    let cdf = latency_cdf_svg(&report);
    check_svg(&cdf);
    assert_eq!(count(&cdf, CURVE), 1, "WRITE has no samples");
    assert!(cdf.contains("\nno samples\n"));
    let tp = throughput_svg(&report);
    check_svg(&tp);
    assert_eq!(count(&tp, "<circle"), 1, "a lone point is drawn as a dot");
    assert!(!tp.contains("errors/s"), "no errors, no errors curve");
    assert_eq!(fault_markers(&tp).len(), 1, "the NaN fault is skipped");
    assert!(tp.contains("\n500\n"), "the axis reaches the late fault");
    let files = write_report(dir.path(), &report);
    // NaN is written as null in JSON; reading back is refused, not misread.
    assert!(files.is_ok());
    assert!(read_report(dir.path()).is_err());
}

#[test]
fn summary_table_is_aligned_text() {
    let report = sample_report();
    let table = summary_table(&report);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 1 + 4 + 1, "{table}");
    assert!(lines[0].trim_start().starts_with("operation"));
    assert!(lines[1].trim_start().starts_with("READ "));
    assert!(lines[5].trim_start().starts_with("all "));
    // Right-aligned numbers: every line ends at the same column.
    let width = lines[0].chars().count();
    assert!(lines.iter().all(|l| l.chars().count() == width), "{table}");
    assert!(table.contains(&format!(" {} ", report.ops["READ"].latency.quantile(0.99))));
    assert!(!table.contains('|'));
}

#[test]
fn errors_name_the_file_and_chain_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, "x").unwrap();
    let err = write_report(&blocker.join("run"), &RunReport::default()).unwrap_err();
    assert!(matches!(err, ReportError::CreateDir { .. }));
    assert!(err.to_string().contains("file/run"), "{err}");
    assert!(std::error::Error::source(&err).is_some());

    let err = read_report(&dir.path().join("missing.json")).unwrap_err();
    assert!(err.to_string().contains("missing.json"), "{err}");
    let err = read_report(&blocker).unwrap_err();
    assert!(matches!(err, ReportError::Json { .. }), "{err}");
}

// ---------------------------------------------------------------------------
// One definition of recovery; the tail plot

/// 100 ms buckets: ten of 10 completions, a fault at 1.0 s, 3 requests in
/// flight completing in the fault's bucket, a second without any, then
/// back to 10 a bucket.
fn stalled_report() -> RunReport {
    let mut completions = vec![10u64; 10];
    completions.push(3);
    completions.extend([0; 10]);
    completions.extend([10; 9]);
    RunReport {
        run_id: "stall".to_owned(),
        duration_s: 3.0,
        timeline: timeline(100, &completions),
        faults: vec![FaultRecord {
            at_s: 1.0,
            kind: "kill-server".to_owned(),
            target: "B".to_owned(),
            restored_at_s: Some(1.5),
            errors_seen: 4,
            ..FaultRecord::default()
        }],
        ..RunReport::default()
    }
}

#[test]
fn notes_table_and_plot_give_the_same_recovery() {
    let mut report = stalled_report();
    // Requests did complete right after the fault, which is not recovery.
    assert_eq!(report.timeline.first_completion_after(1.0), Some(1.0));
    report.note_faults();
    let fault = &report.faults[0];
    assert_eq!(fault.recovery_ms, Some(1100.0));
    assert_eq!(fault.stall_ms, Some(1000.0));

    assert_eq!(report.notes.len(), 1, "{:?}", report.notes);
    let note = &report.notes[0];
    assert!(note.contains("recovery 1100 ms"), "{note}");
    assert!(
        note.contains("longest stall without any completion 1000 ms"),
        "{note}"
    );
    assert!(note.contains(RECOVERY_DEFINITION), "{note}");
    assert!(!note.contains("first completed"), "{note}");

    let md = markdown(&report);
    let row = md
        .lines()
        .find(|l| l.starts_with("| 1 ") && l.contains("kill-server"))
        .unwrap_or_else(|| panic!("no fault row in\n{md}"));
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    assert_eq!(cells[6], "1100", "recovery column: {row}");
    assert_eq!(cells[7], "1000", "stall column: {row}");
    assert!(
        md.contains("Slowest recovery after a fault: 1100 ms."),
        "{md}"
    );
    assert!(
        md.contains(note.as_str()),
        "the note is in the report: {md}"
    );

    let plot = throughput_svg(&report);
    assert!(plot.contains("kill-server B (recovery 1100 ms)"), "{plot}");
}

#[test]
fn stall_is_measured_up_to_recovery_or_the_end() {
    let t = timeline(100, &[10, 10, 0, 0, 10, 0, 0, 0]);
    // Recovered at 0.4 s: only the gap before it counts.
    assert_eq!(t.stall_after(0.2, Some(200.0)), Some(200.0));
    // Never recovered: to the end.
    assert_eq!(t.stall_after(0.2, None), Some(300.0));
    // Requests never stopped completing.
    assert_eq!(
        timeline(100, &[10, 10, 10]).stall_after(0.1, Some(0.0)),
        Some(0.0)
    );
    assert_eq!(t.stall_after(f64::NAN, None), None);
    assert_eq!(t.stall_after(0.8, None), None, "past the end of the data");
    let fault = FaultRecord {
        at_s: 0.2,
        kind: "restart-all".to_owned(),
        recovery_ms: None,
        stall_ms: Some(0.0),
        ..FaultRecord::default()
    };
    let line = fault.describe();
    assert!(
        line.starts_with("restart-all at 0.200 s: no recovery measured"),
        "{line}"
    );
    assert!(line.contains("requests never stopped completing"), "{line}");
}

#[test]
fn the_tail_plot_shows_one_slow_operation_in_a_thousand() {
    let mut ops = BTreeMap::new();
    let latencies = std::iter::repeat_n(100, 999).chain([1_000_000]);
    ops.insert("READ".to_owned(), stats(latencies, 0, 64));
    let h = &ops["READ"].latency;
    let points = svg::tail_points(h);
    assert_eq!(points.first(), Some(&(100.0, 1.0)));
    let &(x, y) = points.last().expect("points");
    assert!(
        (y - 0.001).abs() < 1e-12,
        "the slowest one in a thousand: {points:?}"
    );
    assert!(x >= 999_000.0, "at about a second: {points:?}");
    assert!(
        points.iter().all(|p| p.1 > 0.0),
        "fits a log axis: {points:?}"
    );
    assert!(
        points
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 && w[0].1 >= w[1].1),
        "a descending staircase: {points:?}"
    );

    let report = RunReport {
        run_id: "tail".to_owned(),
        ops,
        ..RunReport::default()
    };
    let tail = latency_tail_svg(&report);
    check_svg(&tail);
    assert_eq!(count(&tail, CURVE), 1, "{tail}");
    assert!(tail.contains("max 1 s"), "the legend gives the max: {tail}");
    assert!(
        tail.contains("1e-3"),
        "the y axis reaches one in a thousand: {tail}"
    );
    let empty = latency_tail_svg(&RunReport::default());
    check_svg(&empty);
    assert!(empty.contains("no data"));
}
