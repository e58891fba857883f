//! `reprobench bench tables`, measured here beside the code it measures: the main and overlap
//! tables over generated result rows (5 agents × 2 variants × 2 backbones × 5 repeats over as
//! many instances as it takes), seeded so every run builds the same rows.

use crate::{frame, tables};
use reprobench_domain::results::ResultRow;
use reprobench_domain::synthetic::SplitMix64;
use std::time::Instant;

/// Why the benchmark could not build its tables.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The rows did not become a frame.
    #[error("building the frame: {0}")]
    Frame(#[from] polars::prelude::PolarsError),
    /// A table could not be built.
    #[error("building a table: {0}")]
    Table(#[from] tables::TableError),
}

/// `rows` generated result rows, seeded.
pub fn generated_rows(rows: usize) -> Vec<ResultRow> {
    let mut rng = SplitMix64::new(7);
    let cells = 5 * 2 * 2 * 5;
    let instances = rows.div_ceil(cells);
    let mut out = Vec::with_capacity(rows);
    'outer: for agent in 0..5 {
        for variant in ["full", "no-x"] {
            for backbone in ["m1", "m2"] {
                for repeat in 0..5u32 {
                    for i in 0..instances {
                        if out.len() == rows {
                            break 'outer;
                        }
                        let success = rng.next_f64() < 0.3 + 0.1 * agent as f64;
                        out.push(ResultRow {
                            run_id: "bench".into(),
                            dataset: format!("d{}", i % 3),
                            instance_id: format!("inst-{i}"),
                            repo_or_app: format!("repo-{}", i % 50),
                            bug_type: Some(if i % 2 == 0 { "crash" } else { "non-crash" }.into()),
                            agent: format!("agent-{agent}"),
                            variant: variant.into(),
                            backbone: backbone.into(),
                            repeat,
                            success,
                            actions: Some((rng.next_u64() % 40) as u32),
                            tokens_in: rng.next_u64() % 100_000,
                            tokens_out: rng.next_u64() % 10_000,
                            cost_usd: rng.next_f64(),
                            wall_s: rng.next_f64() * 600.0,
                            ..Default::default()
                        });
                    }
                }
            }
        }
    }
    out
}

/// Seconds to generate `rows` rows, make a frame of them, and build the main and overlap tables.
pub fn tables(rows: usize) -> Result<serde_json::Value, BenchError> {
    let t0 = Instant::now();
    let generated = generated_rows(rows);
    let generate_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let df = frame::to_frame(&generated)?;
    let frame_s = t1.elapsed().as_secs_f64();
    let opts = tables::TableOptions::default();
    let t2 = Instant::now();
    let main = tables::build("main", &df, &opts)?;
    let main_s = t2.elapsed().as_secs_f64();
    let t3 = Instant::now();
    let overlap = tables::build("overlap", &df, &opts)?;
    let overlap_s = t3.elapsed().as_secs_f64();
    Ok(serde_json::json!({
        "rows": generated.len(),
        "main_rows": main[0].rows.len(),
        "overlap_rows": overlap[0].rows.len(),
        "generate_s": generate_s,
        "to_frame_s": frame_s,
        "main_s": main_s,
        "overlap_s": overlap_s,
        "main_plus_overlap_s": main_s + overlap_s,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_generated_rows_are_the_same_every_time_and_as_many_as_asked() {
        let a = super::generated_rows(1_003);
        assert_eq!(a.len(), 1_003);
        assert_eq!(a, super::generated_rows(1_003));
        let v = super::tables(2_000).unwrap();
        assert_eq!(v["rows"], 2_000);
        assert!(v["main_rows"].as_u64().unwrap() >= 5, "{v}");
    }
}
