//! Hand-written SVG plots of a table's primary metric against message size: log2 x axis,
//! log10 y axis, one polyline per variant. No plotting crate: the format is a few elements.

use super::plan::human_size;
use super::report::TableResult;
use std::fmt::Write as _;

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 60.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 4] = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The y axis label: `MB/s`, `one-way p50 µs`.
fn axis_label(metric: &str, unit: &str) -> String {
    match metric {
        "lat_us_mean" => format!("one-way mean {unit}"),
        "lat_us_p50" => format!("one-way p50 {unit}"),
        "lat_us_p99" => format!("one-way p99 {unit}"),
        _ => unit.to_string(),
    }
}

/// The plot of `t`, or `None` when it has fewer than two points with values.
pub fn plot(t: &TableResult, subtitle: &str) -> Option<String> {
    let series: Vec<(String, Vec<(f64, f64)>)> = t
        .variants
        .iter()
        .enumerate()
        .map(|(vi, v)| {
            let pts = t
                .points
                .iter()
                .filter_map(|p| {
                    let y = *p.results.get(vi)?.median.get(&t.primary)?;
                    (y > 0.0 && p.msg_size > 0).then_some((p.msg_size as f64, y))
                })
                .collect();
            (v.label.clone(), pts)
        })
        .collect();
    let all: Vec<(f64, f64)> = series.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    if all.len() < 2 {
        return None;
    }
    let (xmin, xmax) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), &(x, _)| {
        (a.min(x.log2()), b.max(x.log2()))
    });
    let (ymin, ymax) = all.iter().fold((f64::MAX, f64::MIN), |(a, b), &(_, y)| {
        (a.min(y.log10()), b.max(y.log10()))
    });
    let (xmin, xmax) = (xmin.floor(), xmax.ceil().max(xmin.floor() + 1.0));
    let (ymin, ymax) = (ymin.floor(), ymax.ceil().max(ymin.floor() + 1.0));
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let sx = |x: f64| LEFT + (x.log2() - xmin) / (xmax - xmin) * pw;
    let sy = |y: f64| TOP + ph - (y.log10() - ymin) / (ymax - ymin) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        esc(&t.title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="32" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    // Grid and x labels at every power of two that is a whole step (every other one when
    // crowded).
    let span = (xmax - xmin) as i64;
    let step = if span > 10 { 2 } else { 1 };
    for e in (xmin as i64..=xmax as i64).step_by(step) {
        let x = sx(2f64.powi(e as i32));
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/>"##,
            TOP + ph
        );
        let _ = writeln!(
            s,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 16.0,
            esc(&human_size(1usize << e.clamp(0, 40)))
        );
    }
    for e in ymin as i64..=ymax as i64 {
        let y = sy(10f64.powi(e as i32));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
            LEFT + pw
        );
        let label = if e >= 0 {
            format!("{}", 10u64.pow(e as u32))
        } else {
            format!("{}", 10f64.powi(e as i32))
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size, log2 scale</text>"#,
        LEFT + pw / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}, log scale</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        esc(&axis_label(&t.primary, &t.unit))
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = COLOURS[i % COLOURS.len()];
        let poly: Vec<String> = pts
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#,
            poly.join(" ")
        );
        for &(x, y) in pts {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{c}"/>"#,
                sx(x),
                sy(y)
            );
        }
        // The legend sits in one row between the subtitle and the plot.
        let ly = TOP - 10.0;
        let lx = LEFT + 130.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{lx:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{c}" stroke-width="2"/>"#,
            ly - 4.0,
            lx + 20.0,
            ly - 4.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{ly:.1}">{}</text>"#,
            lx + 26.0,
            esc(label)
        );
    }
    s.push_str("</svg>\n");
    Some(s)
}
