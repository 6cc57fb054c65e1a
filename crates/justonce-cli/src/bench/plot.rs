//! Throughput by batch size, one line per variant, as a small hand-written SVG.

use std::fmt::Write as _;

use super::BenchReport;

const COLORS: [&str; 4] = ["#555555", "#d62728", "#ff7f0e", "#2ca02c"];

/// The main sweep (the first concurrency, message size, workers and ids): msgs/s against
/// batch size on a logarithmic axis.
pub(crate) fn svg(r: &BenchReport) -> String {
    const W: f64 = 760.0;
    const H: f64 = 400.0;
    const L: f64 = 70.0;
    const B: f64 = 50.0;
    const R: f64 = 170.0;
    // The batch sweep only: the first case's concurrency, size, workers and ids.
    let (c0, s0, w0, ids0) = r.variants.first().map_or((1, 0, 0, ""), |v| {
        (v.concurrency, v.msg_bytes, v.workers, v.ids.as_str())
    });
    let main: Vec<_> = r
        .variants
        .iter()
        .filter(|v| {
            (v.concurrency, v.msg_bytes, v.workers, v.ids.as_str()) == (c0, s0, w0, ids0)
                && !v.tls
                && v.msgs_per_sec.is_finite()
        })
        .collect();
    let mut batches: Vec<usize> = main.iter().map(|v| v.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let lo = (batches.first().copied().unwrap_or(1).max(1) as f64).log10();
    let hi = (batches.last().copied().unwrap_or(1).max(1) as f64)
        .log10()
        .max(lo + 1.0);
    let y_max = main.iter().map(|v| v.msgs_per_sec).fold(1.0, f64::max) * 1.1;
    let x = |b: usize| L + (W - L - R) * ((b.max(1) as f64).log10() - lo) / (hi - lo);
    let y = |v: f64| H - B - (H - B - 40.0) * v / y_max;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = write!(
        s,
        r#"<text x="{L}" y="20" font-size="13">justonce bench: {} transport, {} store — msgs/s by batch size ({} B, concurrency {c0}, median of {})</text>"#,
        r.transport, r.store, s0, r.repeats
    );
    let _ = write!(
        s,
        r#"<line x1="{L}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{L}" y1="40" x2="{L}" y2="{0}" stroke="black"/>"#,
        H - B,
        W - R
    );
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{v:.0}</text><line x1="{L}" y1="{1}" x2="{2}" y2="{1}" stroke="#eeeeee"/>"##,
            L - 6.0,
            y(v),
            W - R
        );
    }
    for &b in &batches {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{b}</text>"#,
            x(b),
            H - B + 16.0
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">batch size (log scale)</text>"#,
        (L + W - R) / 2.0,
        H - 12.0
    );
    let mut names: Vec<&str> = main.iter().map(|v| v.name.as_str()).collect();
    names.dedup();
    let mut seen = Vec::new();
    for n in names {
        if seen.contains(&n) {
            continue;
        }
        seen.push(n);
    }
    for (i, name) in seen.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let mut pts: Vec<_> = main.iter().filter(|v| v.name == *name).collect();
        pts.sort_by_key(|v| v.batch);
        let path: Vec<String> = pts
            .iter()
            .map(|v| format!("{:.1},{:.1}", x(v.batch), y(v.msgs_per_sec)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        for v in &pts {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                x(v.batch),
                y(v.msgs_per_sec)
            );
        }
        let ly = 60.0 + 18.0 * i as f64;
        let _ = write!(
            s,
            r#"<line x1="{0}" y1="{ly}" x2="{1}" y2="{ly}" stroke="{color}" stroke-width="2"/><text x="{2}" y="{3}">{name}</text>"#,
            W - R + 15.0,
            W - R + 35.0,
            W - R + 40.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}
