//! `reprobench bench grade`, measured here beside the grading it measures: cases per second of
//! grading a parity corpus (reading the files and grading, then grading only), how many cases
//! agree with the verdicts stored beside them, and logs per second of each parser family on one
//! log of a given size.

use crate::case::{self, CaseError};
use crate::grading::{self, Family, RUNS, Rules};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The grade directories of a corpus (those with a `case.json`), sorted.
pub fn corpus_cases(corpus: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(corpus)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("case.json").is_file())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The figures over the grade directories `dirs`: `rounds` rounds each (the median round
/// reported), and one log of `log_bytes` per parser family.
pub fn grade(
    dirs: &[PathBuf],
    rounds: usize,
    log_bytes: usize,
) -> Result<serde_json::Value, CaseError> {
    let rules = Rules::default();
    let keys = [
        "resolved",
        "applicable",
        "f2x",
        "f2p",
        "p2p",
        "tests_pred",
        "tests_gold",
        "tests_base",
    ];
    let mut agree = 0;
    for d in dirs {
        let got = serde_json::to_value(case::grade_dir(d, rules, false)?).unwrap_or_default();
        let want: serde_json::Value = std::fs::read(d.join("expected.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        if keys.iter().all(|k| got.get(k) == want.get(k)) {
            agree += 1;
        }
    }
    let rate = |secs: Vec<f64>| dirs.len() as f64 / median(secs);
    let with_io = rate(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                for d in dirs {
                    std::hint::black_box(case::grade_dir(d, rules, false).ok());
                }
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    let loaded: Vec<(Family, [grading::RunInput; 6])> = dirs
        .iter()
        .map(|d| case::load(d).map(|(_, f, runs)| (f, runs)))
        .collect::<Result<_, _>>()?;
    let in_memory = rate(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                for (family, runs) in &loaded {
                    std::hint::black_box(grading::grade(runs, *family, rules, false).ok());
                }
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    let corpus_bytes: usize = loaded
        .iter()
        .flat_map(|(_, runs)| runs.iter().filter_map(|r| r.log.as_ref().map(String::len)))
        .sum();
    // One log of `log_bytes` per family: a corpus log of that family, its lines repeated.
    let mut per_family = serde_json::Map::new();
    for family in Family::ALL.into_iter().filter(|f| *f != Family::Unittest) {
        let Some(seed) = loaded
            .iter()
            .filter(|(f, _)| *f == family)
            .flat_map(|(_, runs)| runs.iter().filter_map(|r| r.log.as_deref()))
            .max_by_key(|l| l.len())
        else {
            continue;
        };
        let mut log = String::with_capacity(log_bytes + seed.len());
        while log.len() < log_bytes {
            log.push_str(seed);
        }
        log.truncate(log.floor_char_boundary(log_bytes));
        let reps = 200;
        let secs = median(
            (0..5)
                .map(|_| {
                    let t = Instant::now();
                    for _ in 0..reps {
                        std::hint::black_box(grading::execution_log::read(
                            Some(&log),
                            family,
                            rules,
                        ));
                    }
                    t.elapsed().as_secs_f64() / reps as f64
                })
                .collect(),
        );
        per_family.insert(
            family.name().into(),
            serde_json::json!({"logs_per_s": 1.0 / secs, "mb_per_s": log.len() as f64 / secs / 1e6}),
        );
    }
    Ok(serde_json::json!({
        "cases": dirs.len(),
        "logs_per_case": RUNS.len(),
        "corpus_log_bytes": corpus_bytes,
        "agree_with_expected": agree,
        "cases_per_s_with_io": with_io,
        "cases_per_s_in_memory": in_memory,
        "log_bytes": log_bytes,
        "one_log": per_family,
    }))
}
