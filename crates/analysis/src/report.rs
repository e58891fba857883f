//! The HTML report's content: the paper tables that apply to a set of results, the figures drawn
//! from them, and the per-instance rows, rendered by [`crate::html`].

use crate::{frame, html, plots, table, tables};
use polars::prelude::PolarsResult;
use reprobench_domain::results::ResultRow;

/// The report of `rows` as one HTML document. Tables that do not apply to these results (no
/// variants, no localization) are left out.
pub fn page(title: &str, rows: Vec<ResultRow>) -> PolarsResult<String> {
    let df = frame::to_frame(&rows)?;
    let opts = tables::TableOptions::default();
    let mut built = Vec::new();
    let mut figures = Vec::new();
    for kind in [
        "main",
        "ablation",
        "overlap",
        "repo",
        "cost",
        "localization",
    ] {
        // Kinds that do not apply to these results (no variants, no localization) are left out.
        if let Ok(ts) = tables::build(kind, &df, &opts) {
            if kind == "ablation" {
                let bars: Vec<(String, f64)> = table::json(&ts[0])
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        (
                            r["variant"].as_str().unwrap_or("").to_string(),
                            r["success_rate_pct"].as_f64().unwrap_or(f64::NAN),
                        )
                    })
                    .collect();
                figures.push((
                    "Ablation: success rate per variant".to_string(),
                    plots::ablation_bars("Ablation", &bars),
                ));
            }
            built.extend(ts);
        }
    }
    if let Ok((sets, _)) = tables::solved_sets(&df) {
        let sets: Vec<(String, std::collections::BTreeSet<String>)> = sets.into_iter().collect();
        figures.push((
            "Overlap of solved instances".to_string(),
            plots::upset("Solved instances", &sets),
        ));
    }
    if let (Ok(main), Ok(cost)) = (
        tables::build("main", &df, &opts),
        tables::build("cost", &df, &opts),
    ) {
        let (m, c) = (table::json(&main[0]), table::json(&cost[0]));
        let points: Vec<(String, f64, f64)> = m
            .as_array()
            .into_iter()
            .flatten()
            .zip(c.as_array().into_iter().flatten())
            .map(|(m, c)| {
                (
                    m["method"].as_str().unwrap_or("").to_string(),
                    c["cost_per_task_usd"].as_f64().unwrap_or(f64::NAN),
                    m["success_rate_pct"].as_f64().unwrap_or(f64::NAN),
                )
            })
            .collect();
        figures.push((
            "Success rate against cost per task".to_string(),
            plots::success_vs_cost("Success vs. cost", &points),
        ));
    }
    Ok(html::render_report(&html::ReportInput {
        title: title.into(),
        tables: built,
        plots: figures,
        rows,
    }))
}
