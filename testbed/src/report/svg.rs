//! The report's plots as hand-written SVG (800 × 400): a latency CDF per
//! operation and throughput over time with the faults marked.

use std::fmt::Write as _;

use super::RunReport;

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 400.0;

/// Line colours, one per series in order (the Tableau 10 palette).
const PALETTE: [&str; 10] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

/// Most points of one CDF curve.
const CDF_POINTS: usize = 400;
/// Most points of the throughput curve.
const THROUGHPUT_POINTS: usize = 600;

/// `text` escaped for XML text and attribute values.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 does not allow at all.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The plotting area inside the margins, in SVG user units.
#[derive(Debug, Clone, Copy)]
struct Frame {
    left: f64,
    top: f64,
    right: f64,
    bottom: f64,
}

impl Frame {
    fn width(&self) -> f64 {
        self.right - self.left
    }

    fn height(&self) -> f64 {
        self.bottom - self.top
    }

    fn center(&self) -> (f64, f64) {
        (
            (self.left + self.right) / 2.0,
            (self.top + self.bottom) / 2.0,
        )
    }
}

/// An SVG document being written.
struct Svg {
    out: String,
}

impl Svg {
    fn new(title: &str) -> Self {
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(out, "<title>{}</title>", esc(title));
        let _ = writeln!(
            out,
            r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
            WIDTH / 2.0,
            esc(title)
        );
        Svg { out }
    }

    fn line(&mut self, (x1, y1): (f64, f64), (x2, y2): (f64, f64), style: &str) {
        let _ = writeln!(
            self.out,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {style}/>"#
        );
    }

    fn text(&mut self, (x, y): (f64, f64), anchor: &str, text: &str, extra: &str) {
        let _ = writeln!(
            self.out,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}"{}{extra}>{}</text>"#,
            if extra.is_empty() { "" } else { " " },
            esc(text)
        );
    }

    fn polyline(&mut self, points: &[(f64, f64)], colour: &str, label: &str) {
        let mut coords = String::new();
        for (i, (x, y)) in points.iter().enumerate() {
            if i > 0 {
                coords.push(' ');
            }
            let _ = write!(coords, "{x:.1},{y:.1}");
        }
        let _ = writeln!(
            self.out,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.8" stroke-linejoin="round" points="{coords}"><title>{}</title></polyline>"#,
            esc(label)
        );
        if let [(x, y)] = points {
            let _ = writeln!(
                self.out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{colour}"/>"#
            );
        }
    }

    /// The frame's border and the axis titles.
    fn axes(&mut self, frame: Frame, x_title: &str, y_title: &str) {
        let _ = writeln!(
            self.out,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="none" stroke="#333"/>"##,
            frame.left,
            frame.top,
            frame.width(),
            frame.height()
        );
        self.text(
            ((frame.left + frame.right) / 2.0, HEIGHT - 12.0),
            "middle",
            x_title,
            "",
        );
        let (cy, x) = ((frame.top + frame.bottom) / 2.0, 16.0);
        self.text(
            (x, cy),
            "middle",
            y_title,
            &format!(r#"transform="rotate(-90 {x:.1} {cy:.1})""#),
        );
    }

    fn no_data(&mut self, frame: Frame) {
        self.text(
            frame.center(),
            "middle",
            "no data",
            r##"font-size="20" fill="#888""##,
        );
    }

    fn finish(mut self) -> String {
        self.out.push_str("</svg>\n");
        self.out
    }
}

/// A human latency for a power of ten of microseconds.
fn decade_label(decade: i32) -> String {
    match decade {
        d if d < 0 => format!("1e{d} µs"),
        d if d < 3 => format!("{} µs", 10u64.pow(d as u32)),
        d if d < 6 => format!("{} ms", 10u64.pow(d as u32 - 3)),
        d if d < 26 => format!("{} s", 10u128.pow(d as u32 - 6)),
        d => format!("1e{} s", d - 6),
    }
}

/// A latency in µs for the legend.
fn latency_label(us: u64) -> String {
    match us {
        us if us < 1_000 => format!("{us} µs"),
        us if us < 1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        us => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// The latency CDF plot: one curve per operation with samples (x: latency in
/// µs on a log axis, y: fraction of operations at or below it), with a
/// legend; "no data" without any samples.
pub fn latency_cdf_svg(report: &RunReport) -> String {
    let frame = Frame {
        left: 60.0,
        top: 40.0,
        right: WIDTH - 190.0,
        bottom: HEIGHT - 55.0,
    };
    let mut svg = Svg::new(&format!("Latency CDF — {}", report.run_id));

    let ops = report.ops_in_order();
    let with_samples = ops.iter().filter(|(_, s)| !s.latency.is_empty());
    let lo = with_samples.clone().map(|(_, s)| s.latency.min()).min();
    let hi = with_samples.map(|(_, s)| s.latency.max()).max();
    let (lo_dec, hi_dec) = match (lo, hi) {
        (Some(lo), Some(hi)) => {
            let lo_dec = (lo.max(1) as f64).log10().floor() as i32;
            let hi_dec = (hi.max(1) as f64).log10().ceil() as i32;
            (lo_dec, hi_dec.max(lo_dec + 1))
        }
        _ => (0, 6),
    };
    let x_of = |us: f64| {
        let l = us.max(1.0).log10();
        frame.left + (l - f64::from(lo_dec)) / f64::from(hi_dec - lo_dec) * frame.width()
    };
    let y_of = |fraction: f64| frame.bottom - fraction.clamp(0.0, 1.0) * frame.height();

    // Grid: minor lines at 2..9 × each decade, major lines and labels at the
    // decades; horizontal lines every 0.1.
    for decade in lo_dec..hi_dec {
        for m in 2..10 {
            let x = x_of(f64::from(m) * 10f64.powi(decade));
            svg.line((x, frame.top), (x, frame.bottom), r##"stroke="#eee""##);
        }
    }
    for decade in lo_dec..=hi_dec {
        let x = x_of(10f64.powi(decade));
        svg.line((x, frame.top), (x, frame.bottom), r##"stroke="#ccc""##);
        svg.text(
            (x, frame.bottom + 16.0),
            "middle",
            &decade_label(decade),
            "",
        );
    }
    for tenth in 0..=10 {
        let fraction = f64::from(tenth) / 10.0;
        let y = y_of(fraction);
        let style = if tenth % 5 == 0 {
            r##"stroke="#ccc""##
        } else {
            r##"stroke="#eee""##
        };
        svg.line((frame.left, y), (frame.right, y), style);
        svg.text(
            (frame.left - 6.0, y + 4.0),
            "end",
            &format!("{fraction:.1}"),
            "",
        );
    }
    svg.axes(
        frame,
        "latency (log scale)",
        "fraction of operations ≤ latency",
    );

    // Curves, and a legend with each operation's p50 and p99 on a second
    // line (or just the names when there are too many to fit).
    let legend_x = frame.right + 14.0;
    let detailed = ops.len() as f64 * 30.0 <= frame.height();
    let mut legend_y = frame.top + 8.0;
    for (i, (name, stats)) in ops.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let h = &stats.latency;
        let detail = if h.is_empty() {
            "no samples".to_owned()
        } else {
            // An empirical CDF is a staircase: flat until the next latency,
            // then up by that latency's share.
            let mut points = vec![(x_of(h.min() as f64), y_of(0.0))];
            let mut below = 0.0;
            for (us, fraction) in h.cdf(CDF_POINTS) {
                let x = x_of(us);
                points.push((x, y_of(below)));
                points.push((x, y_of(fraction)));
                below = fraction;
            }
            points.dedup();
            svg.polyline(&points, colour, name);
            format!(
                "p50 {} · p99 {}",
                latency_label(h.quantile(0.5)),
                latency_label(h.quantile(0.99))
            )
        };
        if legend_y > frame.bottom {
            continue;
        }
        if !h.is_empty() {
            svg.line(
                (legend_x, legend_y - 4.0),
                (legend_x + 22.0, legend_y - 4.0),
                &format!(r#"stroke="{colour}" stroke-width="3""#),
            );
        }
        let short: String = if name.chars().count() > 22 {
            name.chars().take(21).chain(['…']).collect()
        } else {
            (*name).to_owned()
        };
        svg.text((legend_x + 28.0, legend_y), "start", &short, "");
        if detailed {
            svg.text(
                (legend_x + 28.0, legend_y + 13.0),
                "start",
                &detail,
                r##"font-size="10.5" fill="#555""##,
            );
            legend_y += 30.0;
        } else {
            legend_y += 17.0;
        }
    }
    if lo.is_none() {
        svg.no_data(frame);
    }
    svg.finish()
}

/// A step of 1, 2, 2.5 or 5 × 10ⁿ giving about `ticks` ticks over `range`.
fn nice_step(range: f64, ticks: f64) -> f64 {
    if !(range.is_finite() && range > 0.0) {
        return 1.0;
    }
    let raw = range / ticks;
    let magnitude = 10f64.powf(raw.log10().floor());
    let norm = raw / magnitude;
    let nice = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 2.5 {
        2.5
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A tick label for `value` on an axis with ticks every `step`, with k / M
/// suffixes for large values.
fn tick_label(value: f64, step: f64, axis_max: f64) -> String {
    let (scale, suffix) = if axis_max >= 1e6 {
        (1e6, "M")
    } else if axis_max >= 1e4 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    if value == 0.0 {
        return "0".to_owned();
    }
    let step = step / scale;
    let decimals = (0..6)
        .find(|&d| {
            let scaled = step * 10f64.powi(d);
            (scaled - scaled.round()).abs() < 1e-6
        })
        .unwrap_or(6) as usize;
    format!("{:.decimals$}{suffix}", value / scale)
}

/// The throughput plot: completions per second over time from the timeline
/// (at most 600 points, summing buckets), errors per second when there were
/// any, and each fault as a dashed vertical line with a label and a shaded
/// span until it was restored.
pub fn throughput_svg(report: &RunReport) -> String {
    let frame = Frame {
        left: 70.0,
        top: 40.0,
        right: WIDTH - 25.0,
        bottom: HEIGHT - 55.0,
    };
    let mut svg = Svg::new(&format!("Throughput over time — {}", report.run_id));
    let points = report.timeline.resample(THROUGHPUT_POINTS);
    let any_errors = points.iter().any(|p| p.2 > 0.0);

    let faults: Vec<_> = report
        .faults
        .iter()
        .filter(|f| f.at_s.is_finite())
        .collect();
    let fault_times = faults.iter().flat_map(|f| {
        std::iter::once(f.at_s.max(0.0)).chain(f.restored_at_s.filter(|r| r.is_finite()))
    });
    let x_max = std::iter::once(report.timeline.span_s())
        .chain(std::iter::once(report.duration_s).filter(|d| d.is_finite()))
        .chain(fault_times)
        .fold(0.0f64, f64::max);
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let x_step = nice_step(x_max, 8.0);
    let x_axis = (x_max / x_step).ceil() * x_step;

    let y_max = points.iter().map(|p| p.1.max(p.2)).fold(0.0f64, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let y_step = nice_step(y_max, 6.0);
    let y_axis = (y_max / y_step).ceil() * y_step;

    let x_of = |s: f64| frame.left + (s / x_axis).clamp(0.0, 1.0) * frame.width();
    let y_of = |v: f64| frame.bottom - (v / y_axis).clamp(0.0, 1.0) * frame.height();

    // Fault spans go under everything else.
    for f in &faults {
        if let Some(restored) = f.restored_at_s.filter(|r| r.is_finite() && *r > f.at_s) {
            let (x1, x2) = (x_of(f.at_s), x_of(restored));
            let _ = writeln!(
                svg.out,
                r##"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#f4a261" fill-opacity="0.2"/>"##,
                frame.top,
                x2 - x1,
                frame.height()
            );
        }
    }

    // Grid and tick labels.
    let x_ticks = (x_axis / x_step).round() as usize;
    for i in 0..=x_ticks {
        let t = i as f64 * x_step;
        let x = x_of(t);
        svg.line((x, frame.top), (x, frame.bottom), r##"stroke="#e4e4e4""##);
        svg.text(
            (x, frame.bottom + 16.0),
            "middle",
            &tick_label(t, x_step, 0.0),
            "",
        );
    }
    let y_ticks = (y_axis / y_step).round() as usize;
    for i in 0..=y_ticks {
        let v = i as f64 * y_step;
        let y = y_of(v);
        svg.line((frame.left, y), (frame.right, y), r##"stroke="#e4e4e4""##);
        svg.text(
            (frame.left - 6.0, y + 4.0),
            "end",
            &tick_label(v, y_step, y_axis),
            "",
        );
    }
    svg.axes(frame, "time since start (s)", "operations per second");

    // Series.
    if !points.is_empty() {
        let ops: Vec<(f64, f64)> = points.iter().map(|p| (x_of(p.0), y_of(p.1))).collect();
        svg.polyline(&ops, PALETTE[0], "completions per second");
        if any_errors {
            let errors: Vec<(f64, f64)> = points.iter().map(|p| (x_of(p.0), y_of(p.2))).collect();
            svg.polyline(&errors, PALETTE[3], "errors per second");
        }
        // Legend in the title row, right-aligned.
        let mut x = frame.right;
        let mut entries = vec![(PALETTE[0], "completions/s")];
        if any_errors {
            entries.push((PALETTE[3], "errors/s"));
        }
        for (colour, label) in entries.into_iter().rev() {
            let text_x = x - 7.0 * label.chars().count() as f64;
            svg.text((x, frame.top - 8.0), "end", label, "");
            svg.line(
                (text_x - 26.0, frame.top - 12.0),
                (text_x - 6.0, frame.top - 12.0),
                &format!(r#"stroke="{colour}" stroke-width="3""#),
            );
            x = text_x - 36.0;
        }
    } else {
        svg.no_data(frame);
    }

    // Fault markers and labels (staggered over three rows).
    for (i, f) in faults.iter().enumerate() {
        let x = x_of(f.at_s);
        svg.line(
            (x, frame.top),
            (x, frame.bottom),
            r##"stroke="#d62728" stroke-width="1.5" stroke-dasharray="5,4""##,
        );
        let mut label = format!("{} {}", f.kind, f.target);
        if let Some(r) = f.recovery_ms.filter(|r| r.is_finite()) {
            let _ = write!(label, " ({r:.0} ms)");
        }
        let y = frame.top + 14.0 + (i % 3) as f64 * 14.0;
        let (anchor, lx) = if x > frame.right - 160.0 {
            ("end", x - 4.0)
        } else {
            ("start", x + 4.0)
        };
        svg.text(
            (lx, y),
            anchor,
            label.trim(),
            r##"fill="#b22222" stroke="white" stroke-width="3" paint-order="stroke""##,
        );
    }
    svg.finish()
}

/// A line chart of named series of (x, y) points on linear axes from zero,
/// with a legend: e.g. throughput against the number of clients.
pub fn xy_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> String {
    let frame = Frame {
        left: 80.0,
        top: 40.0,
        right: WIDTH - 200.0,
        bottom: HEIGHT - 55.0,
    };
    let mut svg = Svg::new(title);
    let finite = series
        .iter()
        .flat_map(|(_, points)| points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (x_max, y_max) = finite.fold((0.0f64, 0.0f64), |(xm, ym), (x, y)| {
        (xm.max(*x), ym.max(*y))
    });
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let (x_step, y_step) = (nice_step(x_max, 8.0), nice_step(y_max, 6.0));
    let (x_axis, y_axis) = (
        (x_max / x_step).ceil() * x_step,
        (y_max / y_step).ceil() * y_step,
    );
    let x_of = |v: f64| frame.left + (v / x_axis).clamp(0.0, 1.0) * frame.width();
    let y_of = |v: f64| frame.bottom - (v / y_axis).clamp(0.0, 1.0) * frame.height();
    for i in 0..=(x_axis / x_step).round() as usize {
        let v = i as f64 * x_step;
        svg.line(
            (x_of(v), frame.top),
            (x_of(v), frame.bottom),
            r##"stroke="#e4e4e4""##,
        );
        svg.text(
            (x_of(v), frame.bottom + 16.0),
            "middle",
            &tick_label(v, x_step, 0.0),
            "",
        );
    }
    for i in 0..=(y_axis / y_step).round() as usize {
        let v = i as f64 * y_step;
        svg.line(
            (frame.left, y_of(v)),
            (frame.right, y_of(v)),
            r##"stroke="#e4e4e4""##,
        );
        svg.text(
            (frame.left - 6.0, y_of(v) + 4.0),
            "end",
            &tick_label(v, y_step, y_axis),
            "",
        );
    }
    svg.axes(frame, x_title, y_title);
    let mut drawn = 0;
    for (i, (name, points)) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let mapped: Vec<(f64, f64)> = points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| (x_of(*x), y_of(*y)))
            .collect();
        if mapped.is_empty() {
            continue;
        }
        svg.polyline(&mapped, colour, name);
        let y = frame.top + 14.0 + 18.0 * drawn as f64;
        svg.line(
            (frame.right + 12.0, y - 4.0),
            (frame.right + 32.0, y - 4.0),
            &format!(r#"stroke="{colour}" stroke-width="3""#),
        );
        svg.text((frame.right + 38.0, y), "start", name, "");
        drawn += 1;
    }
    if drawn == 0 {
        svg.no_data(frame);
    }
    svg.finish()
}
