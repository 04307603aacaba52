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

/// An SVG document `h` high with a white background, a title and a subtitle.
fn header(h: f64, title: &str, subtitle: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="18" font-size="14" font-weight="bold">{}</text>"#,
        esc(title)
    );
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="32" fill="#555">{}</text>"##,
        esc(subtitle)
    );
    s
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

    let mut s = header(H, &t.title, subtitle);
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

/// One bar of [`advantage`]: a point of a table and SMC's advantage over TCP there.
pub struct Bar {
    pub table: String,
    pub point: String,
    /// TCP / SMC for a figure where lower is better (latency), SMC / TCP otherwise: above 1
    /// SMC is better.
    pub advantage: f64,
}

/// The apps suite as one chart: a horizontal bar per point, SMC's advantage over TCP on a
/// log scale (1 = the same; right of it SMC is better), points grouped under their table's
/// title. `None` without bars.
pub fn advantage(bars: &[Bar], title: &str, subtitle: &str) -> Option<String> {
    let bars: Vec<&Bar> = bars
        .iter()
        .filter(|b| b.advantage.is_finite() && b.advantage > 0.0)
        .collect();
    if bars.is_empty() {
        return None;
    }
    const ROW: f64 = 18.0;
    const LABEL: f64 = 150.0;
    let mut tables: Vec<&str> = Vec::new();
    for b in &bars {
        if tables.last() != Some(&b.table.as_str()) {
            tables.push(&b.table);
        }
    }
    let rows = bars.len() + tables.len();
    let ph = ROW * rows as f64;
    let h = TOP + ph + BOTTOM;
    let left = LEFT + LABEL;
    let pw = W - left - RIGHT;
    let (lo, hi) = bars.iter().fold((0.0f64, 0.0f64), |(a, b), x| {
        let l = x.advantage.log10();
        (a.min(l), b.max(l))
    });
    let (lo, hi) = (lo.floor().min(-1.0), hi.ceil().max(1.0));
    let sx = |v: f64| left + (v.log10() - lo) / (hi - lo) * pw;

    let mut s = header(h, title, subtitle);
    // 1, 2 and 5 of each decade while they fit; only the decades past three of them.
    let marks: &[f64] = if hi - lo > 3.0 {
        &[1.0]
    } else {
        &[1.0, 2.0, 5.0]
    };
    for e in lo as i64..=hi as i64 {
        for &m in marks {
            let v = m * 10f64.powi(e as i32);
            if v.log10() > hi + 1e-9 {
                continue;
            }
            let x = sx(v);
            let colour = if (v - 1.0).abs() < 1e-9 {
                "#000"
            } else {
                "#ddd"
            };
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="{colour}"/>"#,
                TOP + ph
            );
            let _ = writeln!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{v}×</text>"#,
                TOP + ph + 16.0
            );
        }
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">SMC's advantage over TCP, log scale (right of 1×: SMC better)</text>"#,
        left + pw / 2.0,
        h - 12.0
    );
    let mut y = TOP;
    let mut last = "";
    let one = sx(1.0);
    for b in &bars {
        if b.table != last {
            let _ = writeln!(
                s,
                r#"<text x="8" y="{:.1}" font-weight="bold">{}</text>"#,
                y + ROW - 5.0,
                esc(&b.table)
            );
            y += ROW;
            last = &b.table;
        }
        let x = sx(b.advantage);
        let (x0, x1) = if x >= one { (one, x) } else { (x, one) };
        let c = if b.advantage >= 1.0 {
            COLOURS[1]
        } else {
            COLOURS[0]
        };
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + ROW - 5.0,
            esc(&b.point)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{x0:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{c}"><title>{}: {:.2}×</title></rect>"#,
            y + 3.0,
            (x1 - x0).max(1.0),
            ROW - 6.0,
            esc(&b.point),
            b.advantage
        );
        y += ROW;
    }
    s.push_str("</svg>\n");
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advantage_chart_has_a_bar_per_point_and_a_title_per_table() {
        let bar = |table: &str, point: &str, advantage: f64| Bar {
            table: table.into(),
            point: point.into(),
            advantage,
        };
        let bars = [
            bar("qperf tcp_lat", "64 B", 20.0),
            bar("qperf tcp_lat", "64 KiB", 0.5),
            bar("redis <GET>", "get", 1.02),
            bar("nginx", "c=8", f64::NAN),
        ];
        let svg = advantage(&bars, "apps & more", "sub").expect("a chart");
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<rect x=").count(), 3, "NaN has no bar");
        assert!(svg.contains("<title>64 B: 20.00×</title>"));
        assert!(svg.contains("redis &lt;GET&gt;") && svg.contains("apps &amp; more"));
        // 20× reaches past the 10× line: the scale goes to 100×.
        assert!(svg.contains(">100×<"));
        assert!(advantage(&[], "t", "s").is_none());
    }
}
