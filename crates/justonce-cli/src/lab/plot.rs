//! Throughput over time with each fault marked, as a small hand-written SVG (no plotting
//! crate needed for one line chart).

use std::fmt::Write as _;
use std::time::Duration;

use super::LabReport;

/// Effects counted over time, and the faults.
#[derive(Debug, Default)]
pub(crate) struct Samples {
    points: Vec<(f64, u64)>,
    marks: Vec<(f64, String)>,
}

impl Samples {
    /// The ledger held `effects` rows at `at`.
    pub(crate) fn push(&mut self, at: Duration, effects: u64) {
        self.points.push((at.as_secs_f64(), effects));
    }

    /// A fault happened at `at`. Every fault the lab fires passes here, so here it is also
    /// logged (`JUSTONCE_LOG=warn,justonce::lab=debug`): a stalled run's worker logs are
    /// read against the faults, in time.
    pub(crate) fn mark(&mut self, at: Duration, label: String) {
        tracing::debug!(target: "justonce::lab", "fault: {label}");
        self.marks.push((at.as_secs_f64(), label));
    }

    /// Effects per second over one-second windows, as an SVG line chart with a red line per
    /// fault.
    pub(crate) fn svg(&self, r: &LabReport) -> String {
        const W: f64 = 900.0;
        const H: f64 = 360.0;
        const L: f64 = 60.0;
        const B: f64 = 40.0;
        let rates = self.rates();
        let t_max = self.points.last().map_or(1.0, |p| p.0).max(1.0);
        let r_max = rates.iter().map(|r| r.1).fold(1.0, f64::max) * 1.1;
        let x = |t: f64| L + (W - L - 20.0) * t / t_max;
        let y = |v: f64| H - B - (H - B - 30.0) * v / r_max;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
        );
        let _ = write!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            s,
            r#"<text x="{L}" y="18" font-size="13">justonce lab: {} on {} + {}, {} — {} ({} lost, {} duplicate effects)</text>"#,
            r.scenario, r.transport, r.store, r.semantics, r.verdict, r.lost, r.duplicate_effects
        );
        let _ = write!(
            s,
            r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="30" x2="{L}" y2="{}" stroke="black"/>"#,
            H - B,
            W - 20.0,
            H - B,
            H - B
        );
        for i in 0..=4 {
            let v = r_max * f64::from(i) / 4.0;
            let _ = write!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{v:.0}</text>"#,
                L - 4.0,
                y(v) + 4.0
            );
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">seconds (0 – {t_max:.0})</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">effects/s</text>"#,
            (L + W) / 2.0,
            H - 8.0,
            H / 2.0,
            H / 2.0
        );
        for (t, label) in &self.marks {
            let _ = write!(
                s,
                r#"<line x1="{0}" y1="30" x2="{0}" y2="{1}" stroke="red" stroke-dasharray="3,3"/><text x="{2}" y="40" fill="red" transform="rotate(90 {2} 40)">{3}</text>"#,
                x(*t),
                H - B,
                x(*t) + 3.0,
                escape(label)
            );
        }
        let path: Vec<String> = rates
            .iter()
            .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="steelblue" stroke-width="1.5" points="{}"/></svg>"#,
            path.join(" ")
        );
        s
    }

    /// (time, effects per second) over windows of about a second.
    fn rates(&self) -> Vec<(f64, f64)> {
        let mut out = Vec::new();
        let mut prev: Option<(f64, u64)> = None;
        for &(t, n) in &self.points {
            match prev {
                Some((pt, pn)) if t - pt >= 1.0 => {
                    out.push((t, n.saturating_sub(pn) as f64 / (t - pt)));
                    prev = Some((t, n));
                }
                None => prev = Some((t, n)),
                _ => {}
            }
        }
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
