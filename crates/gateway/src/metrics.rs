//! Gateway metrics in the Prometheus text exposition format (hand-written, no client library).

use std::collections::BTreeMap;
use std::fmt::Write;

/// Upper bounds (seconds) of the call latency histogram buckets.
pub const LATENCY_BUCKETS_S: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 120.0,
];

#[derive(Debug, Clone, Default)]
struct Histogram {
    buckets: [u64; LATENCY_BUCKETS_S.len()],
    count: u64,
    sum: f64,
}

/// Counters, gauges and the latency histogram, labelled by backbone.
#[derive(Debug, Default)]
pub struct Metrics {
    calls: BTreeMap<(String, u16), u64>,
    tokens: BTreeMap<(String, &'static str), u64>,
    cost_usd: BTreeMap<String, f64>,
    retries: BTreeMap<String, u64>,
    budget_rejections: BTreeMap<String, u64>,
    latency: BTreeMap<String, Histogram>,
    in_flight: i64,
}

impl Metrics {
    /// Records a finished call: its status, tokens, cost and latency.
    #[allow(clippy::too_many_arguments)]
    pub fn record_call(
        &mut self,
        backbone: &str,
        status: u16,
        tokens_in: u64,
        tokens_out: u64,
        tokens_cached: u64,
        cost_usd: f64,
        latency_s: f64,
    ) {
        *self.calls.entry((backbone.into(), status)).or_default() += 1;
        for (kind, n) in [
            ("input", tokens_in),
            ("output", tokens_out),
            ("cached", tokens_cached),
        ] {
            *self.tokens.entry((backbone.into(), kind)).or_default() += n;
        }
        *self.cost_usd.entry(backbone.into()).or_default() += cost_usd;
        let h = self.latency.entry(backbone.into()).or_default();
        for (bucket, bound) in h.buckets.iter_mut().zip(LATENCY_BUCKETS_S) {
            if latency_s <= bound {
                *bucket += 1;
            }
        }
        h.count += 1;
        h.sum += latency_s;
    }

    /// Counts one retried upstream attempt.
    pub fn record_retry(&mut self, backbone: &str) {
        *self.retries.entry(backbone.into()).or_default() += 1;
    }

    /// Counts one call refused by a budget.
    pub fn record_budget_rejection(&mut self, backbone: &str) {
        *self.budget_rejections.entry(backbone.into()).or_default() += 1;
    }

    /// Moves the in-flight gauge by `delta`.
    pub fn add_in_flight(&mut self, delta: i64) {
        self.in_flight += delta;
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        header(
            &mut out,
            "reprobench_gateway_calls_total",
            "counter",
            "Calls answered, by backbone and HTTP status.",
        );
        for ((backbone, status), n) in &self.calls {
            let _ = writeln!(
                out,
                "reprobench_gateway_calls_total{{backbone=\"{}\",status=\"{status}\"}} {n}",
                escape(backbone)
            );
        }
        header(
            &mut out,
            "reprobench_gateway_tokens_total",
            "counter",
            "Tokens by backbone and kind (input includes cached).",
        );
        for ((backbone, kind), n) in &self.tokens {
            let _ = writeln!(
                out,
                "reprobench_gateway_tokens_total{{backbone=\"{}\",kind=\"{kind}\"}} {n}",
                escape(backbone)
            );
        }
        simple(
            &mut out,
            "reprobench_gateway_cost_usd_total",
            "Dollars spent, by backbone.",
            self.cost_usd.iter().map(|(b, v)| (b, v.to_string())),
        );
        simple(
            &mut out,
            "reprobench_gateway_retries_total",
            "Upstream attempts retried, by backbone.",
            self.retries.iter().map(|(b, v)| (b, v.to_string())),
        );
        simple(
            &mut out,
            "reprobench_gateway_budget_rejections_total",
            "Calls refused because a task budget was exhausted, by backbone.",
            self.budget_rejections
                .iter()
                .map(|(b, v)| (b, v.to_string())),
        );
        header(
            &mut out,
            "reprobench_gateway_in_flight",
            "gauge",
            "Calls being answered now.",
        );
        let _ = writeln!(out, "reprobench_gateway_in_flight {}", self.in_flight);
        header(
            &mut out,
            "reprobench_gateway_call_duration_seconds",
            "histogram",
            "Call latency from receipt to last byte, by backbone.",
        );
        for (backbone, h) in &self.latency {
            let b = escape(backbone);
            for (n, bound) in h.buckets.iter().zip(LATENCY_BUCKETS_S) {
                let _ = writeln!(
                    out,
                    "reprobench_gateway_call_duration_seconds_bucket{{backbone=\"{b}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "reprobench_gateway_call_duration_seconds_bucket{{backbone=\"{b}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "reprobench_gateway_call_duration_seconds_sum{{backbone=\"{b}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "reprobench_gateway_call_duration_seconds_count{{backbone=\"{b}\"}} {}",
                h.count
            );
        }
        out
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn simple<'a>(
    out: &mut String,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (&'a String, String)>,
) {
    header(out, name, "counter", help);
    for (backbone, value) in rows {
        let _ = writeln!(out, "{name}{{backbone=\"{}\"}} {value}", escape(backbone));
    }
}

/// Escapes a label value (backslash, quote, newline).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_cumulative_histogram() {
        let mut m = Metrics::default();
        m.record_call("gpt \"x\"", 200, 10, 5, 2, 0.25, 0.02);
        m.record_call("gpt \"x\"", 429, 0, 0, 0, 0.0, 3.0);
        m.record_retry("gpt \"x\"");
        m.add_in_flight(1);
        let text = m.render();
        assert!(text.contains(
            "reprobench_gateway_calls_total{backbone=\"gpt \\\"x\\\"\",status=\"200\"} 1"
        ));
        assert!(text.contains("kind=\"output\"} 5"));
        assert!(text.contains("reprobench_gateway_retries_total{backbone=\"gpt \\\"x\\\"\"} 1"));
        assert!(text.contains("reprobench_gateway_in_flight 1"));
        assert!(text.contains("le=\"0.025\"} 1"));
        assert!(text.contains("le=\"10\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 2"));
    }
}
