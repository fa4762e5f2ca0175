//! What the store's writer thread measures of itself: how long each batch took to commit and
//! how many writes it carried, as cumulative histograms `/metrics` renders
//! (`patterd_store_commit_seconds`, `patterd_store_batch_rows`), plus the batches that failed.
//! Written by the writer only (relaxed atomics), read by the metrics page.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the commit-time buckets; `+Inf` follows.
const COMMIT_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];
/// Upper bounds of the rows-per-batch buckets (a batch holds at most 256 writes).
const ROW_BUCKETS: [f64; 8] = [1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 256.0];

/// One histogram over fixed bounds: per-bucket counts (made cumulative when rendered) and a sum.
struct Buckets<const N: usize> {
    bounds: &'static [f64; N],
    counts: [AtomicU64; N],
    over: AtomicU64,
    /// Sum in millionths of the unit (µs for seconds, micro-rows for rows).
    sum_micro: AtomicU64,
}

impl<const N: usize> Buckets<N> {
    fn new(bounds: &'static [f64; N]) -> Self {
        Self {
            bounds,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            over: AtomicU64::new(0),
            sum_micro: AtomicU64::new(0),
        }
    }

    fn observe(&self, v: f64) {
        match self.bounds.iter().position(|&le| v <= le) {
            Some(i) => self.counts[i].fetch_add(1, Ordering::Relaxed),
            None => self.over.fetch_add(1, Ordering::Relaxed),
        };
        self.sum_micro
            .fetch_add((v * 1e6).max(0.0) as u64, Ordering::Relaxed);
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (le, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {cumulative}");
        }
        cumulative += self.over.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cumulative}");
        let sum = self.sum_micro.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {cumulative}");
    }

    fn count(&self) -> u64 {
        self.counts
            .iter()
            .chain(std::iter::once(&self.over))
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }
}

/// The writer thread's figures.
pub struct StoreStats {
    commit: Buckets<{ COMMIT_BUCKETS.len() }>,
    rows: Buckets<{ ROW_BUCKETS.len() }>,
    failed: AtomicU64,
}

impl Default for StoreStats {
    fn default() -> Self {
        Self {
            commit: Buckets::new(&COMMIT_BUCKETS),
            rows: Buckets::new(&ROW_BUCKETS),
            failed: AtomicU64::new(0),
        }
    }
}

impl StoreStats {
    /// A batch of `rows` writes committed (or failed) after `took`.
    pub(crate) fn batch(&self, rows: usize, took: Duration, ok: bool) {
        if ok {
            self.commit.observe(took.as_secs_f64());
            self.rows.observe(rows as f64);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Batches committed so far.
    pub fn batches(&self) -> u64 {
        self.commit.count()
    }

    /// The upper bound of the commit-time bucket holding quantile `q` (0–1) of the batches
    /// committed so far, in seconds (`None` before any; infinity past the last bucket).
    pub fn commit_quantile(&self, q: f64) -> Option<f64> {
        let total = self.commit.count();
        if total == 0 {
            return None;
        }
        let want = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (le, n) in self.commit.bounds.iter().zip(&self.commit.counts) {
            seen += n.load(Ordering::Relaxed);
            if seen >= want {
                return Some(*le);
            }
        }
        Some(f64::INFINITY)
    }

    /// Writes in the batches committed so far.
    pub fn rows(&self) -> u64 {
        self.rows.sum_micro.load(Ordering::Relaxed) / 1_000_000
    }

    /// Batches given up (their writes are lost; the log says why).
    pub fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Appends the figures in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        self.commit.render(
            "patterd_store_commit_seconds",
            "Time the call store took to commit one batch of writes, in seconds.",
            out,
        );
        self.rows.render(
            "patterd_store_batch_rows",
            "Writes per committed batch of the call store.",
            out,
        );
        let name = "patterd_store_batches_failed_total";
        let _ = writeln!(
            out,
            "# HELP {name} Batches of writes the call store gave up (the log says why).\n# TYPE {name} counter\n{name} {}",
            self.failed()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_render_as_cumulative_histograms() {
        let s = StoreStats::default();
        s.batch(3, Duration::from_micros(800), true);
        s.batch(40, Duration::from_millis(30), true);
        s.batch(7, Duration::from_secs(20), true);
        s.batch(5, Duration::from_millis(1), false);
        let mut out = String::new();
        s.render(&mut out);
        assert!(
            out.contains("patterd_store_commit_seconds_bucket{le=\"0.001\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("patterd_store_commit_seconds_bucket{le=\"0.05\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("patterd_store_commit_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(
            out.contains("patterd_store_commit_seconds_count 3\n"),
            "{out}"
        );
        assert!(
            out.contains("patterd_store_batch_rows_bucket{le=\"5\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("patterd_store_batch_rows_bucket{le=\"10\"} 2\n"),
            "{out}"
        );
        assert!(out.contains("patterd_store_batch_rows_sum 50\n"), "{out}");
        assert!(
            out.contains("patterd_store_batches_failed_total 1\n"),
            "{out}"
        );
        assert_eq!((s.batches(), s.failed()), (3, 1));
        assert_eq!(s.rows(), 50);
        assert_eq!(s.commit_quantile(0.3), Some(0.001));
        assert_eq!(s.commit_quantile(0.5), Some(0.05));
        assert_eq!(s.commit_quantile(1.0), Some(f64::INFINITY));
    }
}
