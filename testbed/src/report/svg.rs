//! The report's plots, drawn with plotters as 800 × 400 SVG: a latency CDF
//! per operation, its tail (the complementary CDF on log axes), throughput
//! over time with the faults marked, and a line chart of named series (e.g.
//! throughput against clients).

use plotters::coord::Shift;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{LatencyHistogram, OpStats, RunReport};

const SIZE: (u32, u32) = (800, 400);
/// Room right of the plotting area for the legend.
const LEGEND_WIDTH: u32 = 230;
/// Series colours in order (the Tableau 10 palette).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];
/// Fault markers and their labels.
const FAULT: RGBColor = RGBColor(0xb2, 0x22, 0x22);
/// Most points of the throughput curve.
const THROUGHPUT_POINTS: usize = 600;
/// Successive CDF steps are at least this factor apart in latency.
const CDF_STEP: f64 = 1.02;

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;
type DrawResult = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Runs `draw` on a white 800 × 400 SVG and returns the document. Drawing
/// into a string with plotters' text-as-SVG-text fonts cannot fail, so an
/// error only truncates the plot.
fn render(draw: impl FnOnce(&Area<'_>) -> DrawResult) -> String {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        let _ = root.fill(&WHITE).and_then(|()| draw(&root));
        let _ = root.present();
    }
    svg
}

fn font(size: u32) -> TextStyle<'static> {
    ("sans-serif", size).into_font().into()
}

/// A chart with a caption, axes titled `x_desc` and `y_desc` (x ticks
/// labelled by `x_label`, y ticks by [`count_label`]) and room for a legend on
/// the right.
fn chart<'a, X, Y>(
    root: &Area<'a>,
    caption: &str,
    x: (X, &str, fn(f64) -> String),
    (y, y_desc): (Y, &str),
) -> Result<Chart<'a, X::CoordDescType, Y::CoordDescType>, DrawingAreaErrorKind<std::io::Error>>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    chart_labelled(root, caption, x, (y, y_desc, count_label))
}

/// [`chart`] with the y ticks labelled by `y_label`.
fn chart_labelled<'a, X, Y>(
    root: &Area<'a>,
    caption: &str,
    (x, x_desc, x_label): (X, &str, fn(f64) -> String),
    (y, y_desc, y_label): (Y, &str, fn(f64) -> String),
) -> Result<Chart<'a, X::CoordDescType, Y::CoordDescType>, DrawingAreaErrorKind<std::io::Error>>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(caption, font(20))
        .margin(10)
        .margin_right(LEGEND_WIDTH)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|v| x_label(*v))
        .y_label_formatter(&|v| y_label(*v))
        .axis_desc_style(font(15))
        .label_style(font(14))
        .draw()?;
    Ok(chart)
}

/// How a legend entry shows its series.
#[derive(Clone, Copy)]
enum Swatch {
    /// Not drawn.
    None,
    /// A line in this colour.
    Line(RGBColor),
    /// A dashed line in this colour.
    Dashed(RGBColor),
}

/// Draws a legend of (label, swatch) entries right of the chart's plotting
/// area (plotters' own legend stays inside it, over the data). A label's
/// lines after the first are details, in smaller grey text.
fn legend<X: Ranged, Y: Ranged>(
    root: &Area<'_>,
    chart: &Chart<'_, X, Y>,
    entries: &[(String, Swatch)],
) -> DrawResult {
    let (xs, ys) = chart.plotting_area().get_pixel_range();
    let (x, mut y) = (xs.end + 12, ys.start + 8);
    for (label, swatch) in entries {
        let (colour, dashes): (_, &[(i32, i32)]) = match *swatch {
            Swatch::None => (BLACK, &[]),
            Swatch::Line(colour) => (colour, &[(0, 20)]),
            Swatch::Dashed(colour) => (colour, &[(0, 8), (12, 20)]),
        };
        for (from, to) in dashes {
            let line = [(x + from, y), (x + to, y)];
            root.draw(&PathElement::new(line, colour.stroke_width(3)))?;
        }
        let mut lines = label.lines();
        let left = Pos::new(HPos::Left, VPos::Center);
        root.draw(&Text::new(
            lines.next().unwrap_or(""),
            (x + 26, y),
            font(14).pos(left),
        ))?;
        for detail in lines {
            y += 14;
            let style = font(12).color(&RGBColor(0x55, 0x55, 0x55)).pos(left);
            root.draw(&Text::new(detail, (x + 26, y), style))?;
        }
        y += 20;
    }
    Ok(())
}

/// "no data" in the middle of `area`.
fn no_data<X: Ranged, Y: Ranged>(chart: &Chart<'_, X, Y>) -> DrawResult {
    let area = chart.plotting_area().strip_coord_spec();
    let (w, h) = area.dim_in_pixel();
    let style = font(24)
        .color(&RGBColor(0x88, 0x88, 0x88))
        .pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new("no data", (w as i32 / 2, h as i32 / 2), style))
}

/// A latency in µs, to at most two decimals of its unit.
fn latency_label(us: f64) -> String {
    let (value, unit) = match us {
        us if us < 1e3 => (us, "µs"),
        us if us < 1e6 => (us / 1e3, "ms"),
        us => (us / 1e6, "s"),
    };
    format!("{} {unit}", (value * 100.0).round() / 100.0)
}

/// A count with k / M suffixes.
fn count_label(v: f64) -> String {
    let round = |v: f64| (v * 1e3).round() / 1e3;
    match v.abs() {
        a if a >= 1e6 => format!("{}M", round(v / 1e6)),
        a if a >= 1e3 => format!("{}k", round(v / 1e3)),
        _ => format!("{}", round(v)),
    }
}

/// The empirical CDF of `h` as a staircase of (µs, fraction ≤), with steps
/// at least [`CDF_STEP`] apart.
fn cdf_points(h: &LatencyHistogram) -> Vec<(f64, f64)> {
    let (min, max) = (h.min().max(1) as f64, h.max().max(1) as f64);
    let mut points = vec![(min, 0.0)];
    for step in h.hdr().iter_log(1, CDF_STEP) {
        if step.count_since_last_iteration() > 0 {
            let x = (step.value_iterated_to() as f64).clamp(min, max);
            let below = points.last().map_or(0.0, |p| p.1);
            points.extend([(x, below), (x, step.quantile())]);
        }
    }
    points
}

/// The latency axis for `ops`: whole decades around every sample, at least
/// two decades wide (1 µs to 1 s without any sample).
fn latency_span(ops: &[(&str, &OpStats)]) -> (f64, f64) {
    let sampled = ops
        .iter()
        .map(|(_, s)| &s.latency)
        .filter(|h| !h.is_empty());
    let decade = |us: u64, round: fn(f64) -> f64| 10f64.powf(round((us.max(1) as f64).log10()));
    let lo = sampled.clone().map(LatencyHistogram::min).min();
    let hi = sampled.map(LatencyHistogram::max).max();
    let (lo, hi) = match (lo, hi) {
        (Some(lo), Some(hi)) => (decade(lo, f64::floor), decade(hi, f64::ceil)),
        _ => (1.0, 1e6),
    };
    (lo, hi.max(lo * 100.0))
}

/// Draws one curve per operation of `ops` with samples (`points` of its
/// histogram) and a legend naming each, with `figures` of it under the
/// name while at most eight fit; "no data" on a chart without any sample.
fn draw_per_operation<X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    root: &Area<'_>,
    chart: &mut Chart<'_, X, Y>,
    ops: &[(&str, &OpStats)],
    points: fn(&LatencyHistogram) -> Vec<(f64, f64)>,
    figures: fn(&LatencyHistogram) -> String,
) -> DrawResult {
    let detailed = ops.len() <= 8;
    let mut entries = Vec::new();
    for (i, (name, stats)) in ops.iter().enumerate() {
        let (colour, h) = (PALETTE[i % PALETTE.len()], &stats.latency);
        if h.is_empty() {
            entries.push((format!("{name}\nno samples"), Swatch::None));
            continue;
        }
        chart.draw_series(LineSeries::new(points(h), colour.stroke_width(2)))?;
        let label = if detailed {
            format!("{name}\n{}", figures(h))
        } else {
            name.to_string()
        };
        entries.push((label, Swatch::Line(colour)));
    }
    legend(root, chart, &entries)?;
    if ops.iter().all(|(_, s)| s.latency.is_empty()) {
        no_data(chart)?;
    }
    Ok(())
}

/// The latency CDF plot: one curve per operation with samples (x: latency
/// on a log axis, y: fraction of operations at or below it) and a legend
/// with each operation's p50 and p99; "no data" without any samples.
pub fn latency_cdf_svg(report: &RunReport) -> String {
    let ops = report.ops_in_order();
    let (lo, hi) = latency_span(&ops);
    render(|root| {
        let mut chart = chart(
            root,
            &format!("Latency CDF — {}", report.run_id),
            ((lo..hi).log_scale(), "latency (log scale)", latency_label),
            (0.0..1.0, "fraction of operations ≤ latency"),
        )?;
        draw_per_operation(root, &mut chart, &ops, cdf_points, |h| {
            format!(
                "p50 {} · p99 {}",
                latency_label(h.quantile(0.5) as f64),
                latency_label(h.quantile(0.99) as f64)
            )
        })
    })
}

/// A fraction on a log axis: `1`, `0.1`, `0.01`, `1e-3`, `1e-4`, …
fn fraction_label(v: f64) -> String {
    if v >= 0.01 {
        format!("{}", (v * 1e4).round() / 1e4)
    } else {
        let exponent = v.log10().round();
        let mantissa = (v / 10f64.powf(exponent) * 10.0).round() / 10.0;
        format!("{mantissa}e{exponent}")
    }
}

/// The tail of `h` as a staircase of (µs, fraction of operations at or
/// above that latency), from (min, 1) down to (max, 1/n): every point is
/// above zero, so it fits log axes, and the slowest operation is the last
/// step.
pub(super) fn tail_points(h: &LatencyHistogram) -> Vec<(f64, f64)> {
    let total = h.hdr().len();
    if total == 0 {
        return Vec::new();
    }
    let n = total as f64;
    let (min, max) = (h.min().max(1) as f64, h.max().max(1) as f64);
    let mut points = vec![(min, 1.0)];
    let mut below = 0u64;
    for step in h.hdr().iter_log(1, CDF_STEP) {
        let count = step.count_since_last_iteration();
        if count == 0 {
            continue;
        }
        let x = (step.value_iterated_to() as f64).clamp(min, max);
        let at_or_above = (total - below) as f64 / n;
        let last = points.last().map_or(1.0, |p| p.1);
        if at_or_above < last {
            points.extend([(x, last), (x, at_or_above)]);
        }
        below += count;
    }
    if let Some(&(x, y)) = points.last()
        && x < max
    {
        points.push((max, y));
    }
    points
}

/// The latency tail plot: per operation with samples, the fraction of
/// operations at or above each latency (the complementary CDF), both axes
/// on a log scale, so that a rare slow second shows as a step at the right
/// instead of vanishing at the top of the CDF; the legend gives each
/// operation's p99.9 and max.
pub fn latency_tail_svg(report: &RunReport) -> String {
    let ops = report.ops_in_order();
    let (lo, hi) = latency_span(&ops);
    let most = ops
        .iter()
        .map(|(_, s)| s.latency.hdr().len())
        .max()
        .unwrap_or(1)
        .max(1);
    // A decade below one operation in the largest sample, so that its
    // step is above the axis.
    let floor = 10f64.powf(-((most as f64).log10().floor() + 1.0)).min(0.1);
    render(|root| {
        let mut chart = chart_labelled(
            root,
            &format!("Latency tail — {}", report.run_id),
            ((lo..hi).log_scale(), "latency (log scale)", latency_label),
            (
                (floor..1.0).log_scale(),
                "fraction of operations ≥ latency (log)",
                fraction_label,
            ),
        )?;
        draw_per_operation(root, &mut chart, &ops, tail_points, |h| {
            format!(
                "p99.9 {} · max {}",
                latency_label(h.quantile(0.999) as f64),
                latency_label(h.max() as f64)
            )
        })
    })
}

/// The throughput plot: completions per second over time from the timeline
/// (at most 600 points, summing buckets), errors per second when there were
/// any, and each fault as a dashed vertical line with a label and a shaded
/// span until it was restored.
pub fn throughput_svg(report: &RunReport) -> String {
    let points = report.timeline.resample(THROUGHPUT_POINTS);
    let any_errors = points.iter().any(|p| p.2 > 0.0);
    let faults: Vec<_> = report
        .faults
        .iter()
        .filter(|f| f.at_s.is_finite())
        .collect();
    let x_max = faults
        .iter()
        .flat_map(|f| [Some(f.at_s), f.restored_at_s.filter(|r| r.is_finite())])
        .flatten()
        .chain(
            [report.timeline.span_s(), report.duration_s]
                .into_iter()
                .filter(|d| d.is_finite()),
        )
        .fold(0.0f64, f64::max);
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let y_max = points.iter().map(|p| p.1.max(p.2)).fold(0.0f64, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    render(|root| {
        let mut chart = chart(
            root,
            &format!("Throughput over time — {}", report.run_id),
            (0.0..x_max, "time since start (s)", count_label),
            (0.0..y_max, "operations per second"),
        )?;
        // Fault spans go under the curves.
        chart.draw_series(faults.iter().filter_map(|f| {
            let restored = f.restored_at_s.filter(|r| r.is_finite() && *r > f.at_s)?;
            let span = [(f.at_s.max(0.0), 0.0), (restored, y_max)];
            Some(Rectangle::new(
                span,
                RGBColor(0xf4, 0xa2, 0x61).mix(0.25).filled(),
            ))
        }))?;
        let rates = |rate: fn(&(f64, f64, f64)) -> f64| -> Vec<(f64, f64)> {
            points.iter().map(|p| (p.0, rate(p))).collect()
        };
        let mut curves = Vec::new();
        if !points.is_empty() {
            curves.push(("completions/s", PALETTE[0], rates(|p| p.1)));
        }
        if any_errors {
            curves.push(("errors/s", PALETTE[3], rates(|p| p.2)));
        }
        let mut entries = Vec::new();
        for (label, colour, series) in curves {
            // A lone point would be an invisible line: draw it as a dot.
            let dot = if series.len() == 1 { 3 } else { 0 };
            chart.draw_series(LineSeries::new(series, colour.stroke_width(2)).point_size(dot))?;
            entries.push((label.to_owned(), Swatch::Line(colour)));
        }
        if !faults.is_empty() {
            entries.push(("fault".to_owned(), Swatch::Dashed(FAULT)));
        }
        for (i, f) in faults.iter().enumerate() {
            let at = f.at_s.max(0.0);
            let marker =
                DashedLineSeries::new([(at, 0.0), (at, y_max)], 6, 4, FAULT.stroke_width(2));
            chart.draw_series(marker)?;
            let mut label = format!("{} {}", f.kind, f.target).trim().to_owned();
            if let Some(r) = f.recovery_ms.filter(|r| r.is_finite()) {
                label.push_str(&format!(" (recovery {r:.0} ms)"));
            }
            // Labels staggered over three rows, left of markers near the end.
            let (x, top) = chart.backend_coord(&(at, y_max));
            let right = at > x_max * 0.7;
            let (h_pos, dx) = if right {
                (HPos::Right, -4)
            } else {
                (HPos::Left, 4)
            };
            let style = font(14).color(&FAULT).pos(Pos::new(h_pos, VPos::Top));
            let y = top + 4 + 16 * (i % 3) as i32;
            root.draw(&Text::new(label, (x + dx, y), style))?;
        }
        legend(root, &chart, &entries)?;
        if points.is_empty() {
            no_data(&chart)?;
        }
        Ok(())
    })
}

/// A line chart of named series of (x, y) points on linear axes from zero,
/// with a dot at every point and a legend: e.g. throughput against the
/// number of clients.
pub fn xy_chart(
    title: &str,
    x_title: &str,
    y_title: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> String {
    let finite = |points: &[(f64, f64)]| -> Vec<(f64, f64)> {
        points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect()
    };
    let (x_max, y_max) = series
        .iter()
        .flat_map(|(_, points)| finite(points))
        .fold((0.0f64, 0.0f64), |(xm, ym), (x, y)| (xm.max(x), ym.max(y)));
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    render(|root| {
        let mut chart = chart(
            root,
            title,
            (0.0..x_max, x_title, count_label),
            (0.0..y_max, y_title),
        )?;
        let mut entries = Vec::new();
        for (i, (name, points)) in series.iter().enumerate() {
            let (colour, points) = (PALETTE[i % PALETTE.len()], finite(points));
            if !points.is_empty() {
                chart.draw_series(LineSeries::new(points, colour.stroke_width(2)).point_size(3))?;
                entries.push((name.to_string(), Swatch::Line(colour)));
            }
        }
        legend(root, &chart, &entries)?;
        if entries.is_empty() {
            no_data(&chart)?;
        }
        Ok(())
    })
}
