//! Analysis over the results schema: the summary table `run` and `quickstart` print, the paper
//! tables (`tables`, computed with polars over the result `frame`; rendered by `table`), the
//! report and its HTML, plots, statistics (`stats`) and the regression gate across runs, and the
//! import of published per-instance results, and `bench`, the tables benchmark.

#[cfg(feature = "frame")]
pub mod bench;
#[cfg(feature = "frame")]
pub mod frame;
pub mod html;
pub mod import;
pub mod plots;
pub mod regression;
#[cfg(feature = "frame")]
pub mod report;
pub mod stats;
pub mod table;
#[cfg(feature = "frame")]
pub mod tables;

use reprobench_domain::results::ResultRow;
use std::collections::{BTreeMap, BTreeSet};

/// Refuses results graded under more than one version of SWT-bench's rules: their rates are not
/// comparable. Rows that record no rules (android, imported without `--rules`) never conflict.
pub fn check_rules<'a>(
    versions: impl IntoIterator<Item = Option<&'a str>>,
    mixed_allowed: bool,
) -> Result<(), MixedRules> {
    let seen: BTreeSet<&str> = versions.into_iter().flatten().collect();
    if seen.len() > 1 && !mixed_allowed {
        return Err(MixedRules {
            rules: seen.into_iter().map(str::to_string).collect(),
        });
    }
    Ok(())
}

/// Results graded under more than one version of the rules, put together without leave.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "these results were graded under different rules ({}); their figures are not comparable. Regrade with `reprobench grade --run RUN --rules R`, or pass --mixed-rules to put them side by side anyway",
    .rules.join(", ")
)]
pub struct MixedRules {
    /// The rules versions seen, in order.
    pub rules: Vec<String>,
}

/// One line of the summary: a (dataset, agent, variant, backbone) cell.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// Dataset name.
    pub dataset: String,
    /// Agent name.
    pub agent: String,
    /// Variant name.
    pub variant: String,
    /// Backbone name.
    pub backbone: String,
    /// Finished tasks.
    pub tasks: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that ended with an error class.
    pub errored: u64,
    /// succeeded / tasks, in percent.
    pub success_rate_pct: f64,
    /// Mean wall seconds over successful tasks (the papers' convention), if any succeeded.
    pub mean_wall_s_success: Option<f64>,
    /// Total dollars.
    pub cost_usd: f64,
}

/// Groups result rows by cell, in a stable order.
pub fn summarize(rows: &[ResultRow]) -> Vec<SummaryRow> {
    let mut cells: BTreeMap<(&str, &str, &str, &str), SummaryRow> = BTreeMap::new();
    let mut wall: BTreeMap<(&str, &str, &str, &str), f64> = BTreeMap::new();
    for r in rows {
        let key = (
            r.dataset.as_str(),
            r.agent.as_str(),
            r.variant.as_str(),
            r.backbone.as_str(),
        );
        let cell = cells.entry(key).or_insert_with(|| SummaryRow {
            dataset: r.dataset.clone(),
            agent: r.agent.clone(),
            variant: r.variant.clone(),
            backbone: r.backbone.clone(),
            tasks: 0,
            succeeded: 0,
            errored: 0,
            success_rate_pct: 0.0,
            mean_wall_s_success: None,
            cost_usd: 0.0,
        });
        cell.tasks += 1;
        cell.cost_usd += r.cost_usd;
        if r.success {
            cell.succeeded += 1;
            *wall.entry(key).or_insert(0.0) += r.wall_s;
        }
        if r.error_class.is_some() {
            cell.errored += 1;
        }
    }
    cells
        .into_iter()
        .map(|(key, mut c)| {
            c.success_rate_pct = 100.0 * c.succeeded as f64 / c.tasks as f64;
            c.mean_wall_s_success = wall.get(&key).map(|w| w / c.succeeded as f64);
            c
        })
        .collect()
}

/// Renders summary rows as an aligned plain-text table.
pub fn render_summary(rows: &[SummaryRow]) -> String {
    let header = [
        "dataset",
        "agent",
        "variant",
        "backbone",
        "tasks",
        "ok",
        "errors",
        "SR %",
        "time/ok (s)",
        "cost ($)",
    ];
    let body: Vec<[String; 10]> = rows
        .iter()
        .map(|r| {
            [
                r.dataset.clone(),
                r.agent.clone(),
                r.variant.clone(),
                r.backbone.clone(),
                r.tasks.to_string(),
                r.succeeded.to_string(),
                r.errored.to_string(),
                format!("{:.1}", r.success_rate_pct),
                r.mean_wall_s_success
                    .map_or("-".into(), |w| format!("{w:.3}")),
                format!("{:.2}", r.cost_usd),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &body {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i < 4 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = line(header.to_vec());
    out.push('\n');
    out.push_str(
        &widths
            .iter()
            .map(|w| "-".repeat(*w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    out.push('\n');
    for row in &body {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod rules_tests {
    use super::check_rules;

    #[test]
    fn mixed_rules_are_refused_unless_allowed() {
        assert!(
            check_rules(
                [Some("swt-bench-2024"), None, Some("swt-bench-2024")],
                false
            )
            .is_ok()
        );
        let e = check_rules([Some("swt-bench-2024"), Some("swt-bench-2025-09")], false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--mixed-rules") && e.contains("swt-bench-2024"),
            "{e}"
        );
        assert!(check_rules([Some("swt-bench-2024"), Some("swt-bench-2025-09")], true).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(variant: &str, success: bool, wall_s: f64, error: Option<&str>) -> ResultRow {
        ResultRow {
            dataset: "d".into(),
            agent: "a".into(),
            variant: variant.into(),
            backbone: "none".into(),
            success,
            wall_s,
            error_class: error.map(str::to_string),
            ..Default::default()
        }
    }

    #[test]
    fn summarizes_per_cell_with_time_over_successes() {
        let rows = vec![
            row("full", true, 2.0, None),
            row("full", true, 4.0, None),
            row("full", false, 100.0, None),
            row("full", false, 1.0, Some("infra:lease_expired")),
            row("no-x", false, 1.0, None),
        ];
        let s = summarize(&rows);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (
                s[0].variant.as_str(),
                s[0].tasks,
                s[0].succeeded,
                s[0].errored
            ),
            ("full", 4, 2, 1)
        );
        assert_eq!(s[0].success_rate_pct, 50.0);
        assert_eq!(s[0].mean_wall_s_success, Some(3.0));
        assert_eq!(s[1].mean_wall_s_success, None);
        let text = render_summary(&s);
        assert_eq!(text.lines().count(), 4);
        assert!(text.lines().nth(2).unwrap().contains("50.0"));
    }
}
