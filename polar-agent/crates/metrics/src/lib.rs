//! The Prometheus text exposition format (version 0.0.4), shared by the
//! agent's and the rollout server's `/metrics`: [`Text`] writes families
//! (`# HELP`, `# TYPE`, samples) and [`Histogram`] is a lock-free
//! cumulative histogram with its rendering.
//!
//! Pure, no dependency at all. Tests: the unit tests below.
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A metrics page being written.
#[derive(Debug, Default)]
pub struct Text(String);

impl Text {
    /// An empty page.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `# HELP` and `# TYPE` lines of a family.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) -> &mut Self {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
        self
    }

    /// One sample; `labels` are `(name, value)` pairs, values escaped.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The page.
    pub fn finish(self) -> String {
        self.0
    }
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The gauges every node's page starts with: sessions by stage
/// (`polar_sessions`) and items waiting per stage (`polar_queue_depth`).
pub fn stage_gauges(
    out: &mut Text,
    sessions_by_stage: &[(&str, u64)],
    queue_depths: &[(&str, u64)],
) {
    out.family("polar_sessions", "gauge", "Sessions on this node by stage.");
    for (stage, n) in sessions_by_stage {
        out.sample("polar_sessions", &[("stage", stage)], n);
    }
    out.family(
        "polar_queue_depth",
        "gauge",
        "Items waiting in each stage's queue.",
    );
    for (stage, n) in queue_depths {
        out.sample("polar_queue_depth", &[("stage", stage)], n);
    }
}

/// A cumulative histogram of durations, in seconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// A histogram with these upper bounds (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(
            u64::try_from(d.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Writes the family `name` (buckets, `+Inf`, sum, count).
    pub fn render(&self, out: &mut Text, name: &str, help: &str) {
        out.family(name, "histogram", help);
        let bucket = format!("{name}_bucket");
        for (bound, n) in self.bounds.iter().zip(&self.buckets) {
            out.sample(
                &bucket,
                &[("le", &bound.to_string())],
                n.load(Ordering::Relaxed),
            );
        }
        let count = self.count();
        out.sample(&bucket, &[("le", "+Inf")], count);
        out.sample(
            &format!("{name}_sum"),
            &[],
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        );
        out.sample(&format!("{name}_count"), &[], count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_samples_and_escaping() {
        let mut t = Text::new();
        t.family("x_total", "counter", "Things.");
        t.sample("x_total", &[("kind", "a\"b\\c\nd"), ("k2", "v")], 3);
        t.single("y", "gauge", "Y.", 1.5);
        assert_eq!(
            t.finish(),
            "# HELP x_total Things.\n# TYPE x_total counter\n\
             x_total{kind=\"a\\\"b\\\\c\\nd\",k2=\"v\"} 3\n\
             # HELP y Y.\n# TYPE y gauge\ny 1.5\n"
        );
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        static B: [f64; 3] = [0.001, 0.01, 0.1];
        let h = Histogram::new(&B);
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_secs(1));
        let mut t = Text::new();
        h.render(&mut t, "lat_seconds", "L.");
        let s = t.finish();
        for line in [
            "lat_seconds_bucket{le=\"0.001\"} 1\n",
            "lat_seconds_bucket{le=\"0.01\"} 2\n",
            "lat_seconds_bucket{le=\"0.1\"} 2\n",
            "lat_seconds_bucket{le=\"+Inf\"} 3\n",
            "lat_seconds_count 3\n",
            "lat_seconds_sum 1.0055\n",
        ] {
            assert!(s.contains(line), "{line:?} in {s}");
        }
    }
}
