//! The paper tables, computed with polars from the results schema: main, ablation, repo,
//! backbone, overlap, localization and cost. Every figure is first computed per repeat and then
//! averaged over repeats with its standard deviation, as the papers report them.

use crate::table::{Cell, Table};
use polars::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// Per-row means and standard deviations of one metric.
type MeanAndStd = (Vec<Option<f64>>, Vec<Option<f64>>);
/// Approach → instances it solved.
type SolvedSets = BTreeMap<String, BTreeSet<String>>;

/// Table kinds.
pub const KINDS: &[&str] = &[
    "main",
    "ablation",
    "repo",
    "backbone",
    "overlap",
    "localization",
    "cost",
];

/// Why a table could not be built. (The messages already include the polars errors they wrap,
/// so none is exposed as a `source`: a reporter printing the chain would repeat it.)
#[derive(Debug, Clone, thiserror::Error)]
pub enum TableError {
    /// The published-results CSV has no header line.
    #[error("the published CSV is empty")]
    EmptyPublished,
    /// The published-results CSV has no `Method` column.
    #[error(
        "the published CSV needs a `Method` column (and numeric columns such as overall_sr_pct, crash_sr_pct, actions, tokens_k, cost_usd, time_min)"
    )]
    NoMethodColumn,
    /// A value of the published-results CSV is not a number.
    #[error("published CSV line {line}: `{value}` in column {column} is not a number")]
    NotANumber {
        /// The line number, from 1 (the header is line 1).
        line: usize,
        /// The value.
        value: String,
        /// The column's header.
        column: String,
    },
    /// A table kind that is none of [`KINDS`].
    #[error("unknown table kind `{kind}`; use one of {}", KINDS.join(", "))]
    UnknownKind {
        /// The kind asked for.
        kind: String,
    },
    /// `--reference` names no row of the table.
    #[error("--reference `{name}` is not a row; rows are: {}", .rows.join(", "))]
    UnknownReference {
        /// The name given.
        name: String,
        /// The rows' names.
        rows: Vec<String>,
    },
    /// The `--reference` row has no overall success rate to compare with.
    #[error("--reference `{name}` has no overall success rate")]
    ReferenceWithoutRate {
        /// The row's name.
        name: String,
    },
    /// No `full` variant to compare the variants with (ablation table).
    #[error(
        "no `full` variant in these results: the ablation table compares the full agent with its variants"
    )]
    NoFullVariant,
    /// No row reports `localized_files_correct` (localization table).
    #[error(
        "no result reports localized_files_correct; the localization table needs an agent that localizes (reproagent)"
    )]
    NoLocalization,
    /// A polars computation failed.
    #[error("{0}")]
    Polars(PolarsError),
}

impl From<PolarsError> for TableError {
    fn from(e: PolarsError) -> TableError {
        TableError::Polars(e)
    }
}

/// Options shared by the tables.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// Row whose relative improvement over every other row is printed (main table).
    pub reference: Option<String>,
    /// Rows of already aggregated figures copied from a paper (main table).
    pub published: Vec<PublishedRow>,
}

/// One row of a paper's aggregated results (columns as in the LTGDroid Table IV CSV).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PublishedRow {
    /// Method name.
    pub method: String,
    /// Column key → value (`overall_sr_pct`, `crash_sr_pct`, `actions`, ...).
    pub values: BTreeMap<String, f64>,
}

/// Reads a published-results CSV: a `Method` column and numeric columns.
pub fn parse_published(text: &str) -> Result<Vec<PublishedRow>, TableError> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<String> = lines
        .next()
        .ok_or(TableError::EmptyPublished)?
        .split(',')
        .map(|h| h.trim().to_string())
        .collect();
    let method_col = header
        .iter()
        .position(|h| h.eq_ignore_ascii_case("method"))
        .ok_or(TableError::NoMethodColumn)?;
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let mut row = PublishedRow {
            method: fields.get(method_col).unwrap_or(&"").to_string(),
            values: BTreeMap::new(),
        };
        for (j, h) in header.iter().enumerate() {
            if j == method_col {
                continue;
            }
            if let Some(v) = fields.get(j).filter(|v| !v.is_empty()) {
                let v: f64 = v.parse().map_err(|_| TableError::NotANumber {
                    line: i + 2,
                    value: v.to_string(),
                    column: h.clone(),
                })?;
                row.values.insert(h.clone(), v);
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

fn strs(df: &DataFrame, name: &str) -> Result<Vec<String>, TableError> {
    Ok(df
        .column(name)?
        .str()?
        .iter()
        .map(|s| s.unwrap_or("").to_string())
        .collect())
}

fn f64s(df: &DataFrame, name: &str) -> Result<Vec<Option<f64>>, TableError> {
    let c = df.column(name)?.cast(&DataType::Float64)?;
    Ok(c.f64()?
        .iter()
        .map(|v| v.filter(|x| x.is_finite()))
        .collect())
}

/// A boolean column, nulls read as false.
fn bools(df: &DataFrame, name: &str) -> Result<Vec<bool>, TableError> {
    Ok(df
        .column(name)?
        .bool()?
        .iter()
        .map(|x| x.unwrap_or(false))
        .collect())
}

/// The label of an approach: `agent`, `agent/variant`, plus ` (backbone)` when several backbones appear.
fn label(agent: &str, variant: &str, backbone: &str, many_backbones: bool) -> String {
    let mut s = if variant == "full" || variant.is_empty() {
        agent.to_string()
    } else {
        format!("{agent}/{variant}")
    };
    if many_backbones {
        s.push_str(&format!(" ({backbone})"));
    }
    s
}

fn many_backbones(df: &DataFrame) -> Result<bool, TableError> {
    Ok(df.column("backbone")?.n_unique()? > 1)
}

fn mean_std(mean: Option<f64>, std: Option<f64>, decimals: u8) -> Cell {
    match mean {
        Some(m) => Cell::MeanStd {
            mean: m,
            std,
            decimals,
        },
        None => Cell::Empty,
    }
}

/// The split of the main table: bug type (android) when present, else dataset when several.
fn split_column(df: &DataFrame) -> Result<Option<&'static str>, TableError> {
    if df.column("bug_type")?.null_count() < df.height() {
        return Ok(Some("bug_type"));
    }
    Ok((df.column("dataset")?.n_unique()? > 1).then_some("dataset"))
}

fn split_key(split: &str, value: &str) -> String {
    if split == "bug_type" {
        format!("{}_sr_pct", value.replace('-', ""))
    } else {
        format!("sr_{}_pct", value.replace(['-', ':', ' '], "_"))
    }
}

const CELL: [&str; 3] = ["agent", "variant", "backbone"];

/// Per (agent, variant, backbone): success rate and the success-only means, averaged over repeats.
fn per_cell(df: &DataFrame) -> Result<DataFrame, TableError> {
    let ok = col("success");
    let per_repeat = df
        .clone()
        .lazy()
        .group_by([col("agent"), col("variant"), col("backbone"), col("repeat")])
        .agg([
            (col("success").cast(DataType::Float64).mean() * lit(100.0)).alias("sr"),
            col("actions")
                .cast(DataType::Float64)
                .filter(ok.clone())
                .mean()
                .alias("actions"),
            ((col("tokens_in") + col("tokens_out")).cast(DataType::Float64) / lit(1000.0))
                .filter(ok.clone())
                .mean()
                .alias("tokens_k"),
            col("cost_usd").filter(ok.clone()).mean().alias("cost_usd"),
            (col("wall_s") / lit(60.0))
                .filter(ok)
                .mean()
                .alias("time_min"),
            // SWT-bench's mean coverage delta: over the tasks that have one, successful or not.
            (col("coverage_delta").cast(DataType::Float64).mean() * lit(100.0))
                .alias("coverage_delta_pct"),
            len().alias("tasks"),
        ]);
    let metrics = [
        "sr",
        "actions",
        "tokens_k",
        "cost_usd",
        "time_min",
        "coverage_delta_pct",
    ];
    let mut aggs: Vec<Expr> = Vec::new();
    for m in metrics {
        aggs.push(col(m).mean().alias(format!("{m}_mean")));
        aggs.push(col(m).std(1).alias(format!("{m}_std")));
    }
    aggs.push(col("tasks").sum().alias("tasks"));
    aggs.push(len().alias("repeats"));
    per_repeat
        .group_by(CELL.map(col))
        .agg(aggs)
        .sort(CELL, SortMultipleOptions::default())
        .collect()
        .map_err(TableError::from)
}

/// Success rate per (cell, split value), averaged over repeats.
fn per_split(df: &DataFrame, split: &str) -> Result<DataFrame, TableError> {
    df.clone()
        .lazy()
        .group_by([
            col("agent"),
            col("variant"),
            col("backbone"),
            col(split),
            col("repeat"),
        ])
        .agg([(col("success").cast(DataType::Float64).mean() * lit(100.0)).alias("sr")])
        .group_by([col("agent"), col("variant"), col("backbone"), col(split)])
        .agg([
            col("sr").mean().alias("sr_mean"),
            col("sr").std(1).alias("sr_std"),
        ])
        .collect()
        .map_err(TableError::from)
}

/// Builds a table of the given kind.
pub fn build(kind: &str, df: &DataFrame, opts: &TableOptions) -> Result<Vec<Table>, TableError> {
    match kind {
        "main" => main(df, opts).map(|t| vec![t]),
        "ablation" => ablation(df),
        "repo" => repo(df).map(|t| vec![t]),
        "backbone" => backbone(df).map(|t| vec![t]),
        "overlap" => overlap(df),
        "localization" => localization(df).map(|t| vec![t]),
        "cost" => cost(df).map(|t| vec![t]),
        other => Err(TableError::UnknownKind { kind: other.into() }),
    }
}

/// The main results table.
pub fn main(df: &DataFrame, opts: &TableOptions) -> Result<Table, TableError> {
    struct Row {
        method: String,
        source: &'static str,
        values: BTreeMap<String, Cell>,
        sr: Option<f64>,
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut split_keys: BTreeSet<String> = BTreeSet::new();
    if df.height() > 0 {
        let many = many_backbones(df)?;
        let cells = per_cell(df)?;
        let (agents, variants, backbones) = (
            strs(&cells, "agent")?,
            strs(&cells, "variant")?,
            strs(&cells, "backbone")?,
        );
        let get = |m: &str| -> Result<MeanAndStd, TableError> {
            Ok((
                f64s(&cells, &format!("{m}_mean"))?,
                f64s(&cells, &format!("{m}_std"))?,
            ))
        };
        let (sr, sr_sd) = get("sr")?;
        let metrics = [
            ("actions", 2u8),
            ("tokens_k", 2),
            ("cost_usd", 3),
            ("time_min", 2),
            ("coverage_delta_pct", 2),
        ]
        .map(|(m, d)| (m, d, get(m)));
        let mut splits: BTreeMap<(String, String, String), BTreeMap<String, Cell>> =
            BTreeMap::new();
        if let Some(split) = split_column(df)? {
            let s = per_split(df, split)?;
            let (a, v, b, k) = (
                strs(&s, "agent")?,
                strs(&s, "variant")?,
                strs(&s, "backbone")?,
                strs(&s, split)?,
            );
            let (m, sd) = (f64s(&s, "sr_mean")?, f64s(&s, "sr_std")?);
            for i in 0..s.height() {
                if k[i].is_empty() {
                    continue;
                }
                let key = split_key(split, &k[i]);
                split_keys.insert(key.clone());
                splits
                    .entry((a[i].clone(), v[i].clone(), b[i].clone()))
                    .or_default()
                    .insert(key, mean_std(m[i], sd[i], 2));
            }
        }
        for i in 0..cells.height() {
            let mut values = splits
                .remove(&(agents[i].clone(), variants[i].clone(), backbones[i].clone()))
                .unwrap_or_default();
            values.insert("success_rate_pct".into(), mean_std(sr[i], sr_sd[i], 2));
            for (m, d, r) in &metrics {
                let (mean, sd) = r.as_ref().map_err(Clone::clone)?;
                values.insert(m.to_string(), mean_std(mean[i], sd[i], *d));
            }
            rows.push(Row {
                method: label(&agents[i], &variants[i], &backbones[i], many),
                source: "ours",
                values,
                sr: sr[i],
            });
        }
    }
    for p in &opts.published {
        let mut values = BTreeMap::new();
        for (k, v) in &p.values {
            let key = if k == "overall_sr_pct" {
                "success_rate_pct".to_string()
            } else {
                k.clone()
            };
            if key.ends_with("_sr_pct") && key != "success_rate_pct" {
                split_keys.insert(key.clone());
            }
            values.insert(key, Cell::num(*v, 2));
        }
        rows.push(Row {
            method: p.method.clone(),
            source: "published",
            sr: p.values.get("overall_sr_pct").copied(),
            values,
        });
    }
    let reference = match &opts.reference {
        Some(name) => {
            let r = rows.iter().find(|r| &r.method == name).ok_or_else(|| {
                TableError::UnknownReference {
                    name: name.clone(),
                    rows: rows.iter().map(|r| r.method.clone()).collect(),
                }
            })?;
            Some((
                name.clone(),
                r.sr.ok_or_else(|| TableError::ReferenceWithoutRate { name: name.clone() })?,
            ))
        }
        None => None,
    };
    let mut columns: Vec<(String, String)> = vec![
        ("method".into(), "Method".into()),
        ("source".into(), "Source".into()),
    ];
    for k in &split_keys {
        let header = k
            .trim_end_matches("_pct")
            .trim_end_matches("_sr")
            .trim_start_matches("sr_")
            .replace('_', " ");
        columns.push((k.clone(), format!("SR {header} (%)")));
    }
    for (k, h) in [
        ("success_rate_pct", "SR (%)"),
        ("actions", "Actions"),
        ("tokens_k", "Tokens (K)"),
        ("cost_usd", "Cost ($)"),
        ("time_min", "Time (min)"),
    ] {
        columns.push((k.into(), h.into()));
    }
    // SWT results carry SWT-bench's coverage delta; android ones have none, and no column.
    let has_coverage = df.height() > 0
        && df
            .column("coverage_delta")
            .map(|c| c.null_count() < c.len())
            .unwrap_or(false);
    if has_coverage {
        columns.push(("coverage_delta_pct".into(), "Coverage Δ (%)".into()));
    }
    if let Some((name, _)) = &reference {
        columns.push((
            "relative_improvement_pct".into(),
            format!("{name} vs. row (%)"),
        ));
    }
    let cols: Vec<(&str, &str)> = columns
        .iter()
        .map(|(k, h)| (k.as_str(), h.as_str()))
        .collect();
    let mut t = Table::new("Main results", &cols);
    for r in rows {
        let mut cells = vec![Cell::text(r.method.clone()), Cell::text(r.source)];
        let mut values = r.values;
        for (k, _) in columns.iter().skip(2) {
            if k == "relative_improvement_pct" {
                let (name, ref_sr) = reference
                    .as_ref()
                    .expect("column exists only with a reference");
                cells.push(match r.sr {
                    Some(sr) if &r.method != name && sr > 0.0 => {
                        Cell::num((ref_sr - sr) / sr * 100.0, 2)
                    }
                    _ => Cell::Empty,
                });
            } else {
                cells.push(values.remove(k).unwrap_or(Cell::Empty));
            }
        }
        t.push(cells);
    }
    t.note = Some(
        "SR over all tasks; Actions, Tokens, Cost and Time averaged over successful tasks; Coverage Δ (SWT-bench's) over the tasks that have one; mean ± std over repeats. Rows marked `published` are a paper's printed figures.".into(),
    );
    Ok(t)
}

/// Full agent against each of its variants.
pub fn ablation(df: &DataFrame) -> Result<Vec<Table>, TableError> {
    let cells = per_cell(df)?;
    let (a, v, b) = (
        strs(&cells, "agent")?,
        strs(&cells, "variant")?,
        strs(&cells, "backbone")?,
    );
    let (sr, sd) = (f64s(&cells, "sr_mean")?, f64s(&cells, "sr_std")?);
    let many = many_backbones(df)?;
    let mut t = Table::new(
        "Ablation",
        &[
            ("variant", "Variant"),
            ("success_rate_pct", "SR (%)"),
            ("drop_pp", "Drop (pp)"),
        ],
    );
    for i in 0..cells.height() {
        if v[i] != "full" {
            continue;
        }
        t.push(vec![
            Cell::text(label(&a[i], "full", &b[i], many)),
            mean_std(sr[i], sd[i], 2),
            Cell::Empty,
        ]);
        for j in 0..cells.height() {
            if a[j] == a[i] && b[j] == b[i] && v[j] != "full" {
                let drop = sr[i].zip(sr[j]).map(|(f, x)| f - x);
                t.push(vec![
                    Cell::text(label(&a[j], &v[j], &b[j], many)),
                    mean_std(sr[j], sd[j], 2),
                    drop.map_or(Cell::Empty, |d| Cell::num(d, 2)),
                ]);
            }
        }
    }
    if t.rows.is_empty() {
        return Err(TableError::NoFullVariant);
    }
    Ok(vec![t])
}

/// Instances solved per approach: an instance counts as solved when any repeat succeeded.
pub fn solved_sets(df: &DataFrame) -> Result<(SolvedSets, BTreeSet<String>), TableError> {
    let many = many_backbones(df)?;
    let solved = df
        .clone()
        .lazy()
        .group_by([
            col("agent"),
            col("variant"),
            col("backbone"),
            col("dataset"),
            col("instance_id"),
        ])
        .agg([col("success").any(false).alias("solved")])
        .collect()?;
    let (a, v, b, d, i) = (
        strs(&solved, "agent")?,
        strs(&solved, "variant")?,
        strs(&solved, "backbone")?,
        strs(&solved, "dataset")?,
        strs(&solved, "instance_id")?,
    );
    let flags = bools(&solved, "solved")?;
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut all = BTreeSet::new();
    for k in 0..solved.height() {
        let inst = format!("{}/{}", d[k], i[k]);
        all.insert(inst.clone());
        let set = sets.entry(label(&a[k], &v[k], &b[k], many)).or_default();
        if flags[k] {
            set.insert(inst);
        }
    }
    Ok((sets, all))
}

/// Solved and uniquely solved per approach, pairwise intersections, and what nobody solved.
pub fn overlap(df: &DataFrame) -> Result<Vec<Table>, TableError> {
    let (sets, all) = solved_sets(df)?;
    let mut per = Table::new(
        "Overlap of solved instances",
        &[
            ("approach", "Approach"),
            ("solved", "Solved"),
            ("uniquely_solved", "Uniquely solved"),
        ],
    );
    for (name, s) in &sets {
        let unique = s
            .iter()
            .filter(|i| sets.iter().all(|(n, o)| n == name || !o.contains(*i)))
            .count();
        per.push(vec![
            Cell::text(name.clone()),
            Cell::Int(s.len() as i64),
            Cell::Int(unique as i64),
        ]);
    }
    let nobody = all
        .iter()
        .filter(|i| sets.values().all(|s| !s.contains(*i)))
        .count();
    per.note = Some(format!(
        "{nobody} of {} instances solved by no approach (an instance counts as solved when any repeat succeeded)",
        all.len()
    ));
    let mut pairs = Table::new(
        "Pairwise intersections",
        &[
            ("approach_a", "A"),
            ("approach_b", "B"),
            ("intersection", "Both solved"),
        ],
    );
    let names: Vec<&String> = sets.keys().collect();
    for (x, a) in names.iter().enumerate() {
        for b in &names[x + 1..] {
            pairs.push(vec![
                Cell::text((*a).clone()),
                Cell::text((*b).clone()),
                Cell::Int(sets[*a].intersection(&sets[*b]).count() as i64),
            ]);
        }
    }
    Ok(vec![per, pairs])
}

/// Per repository (or app): instances, instances reproduced in any repeat, rate.
pub fn repo(df: &DataFrame) -> Result<Table, TableError> {
    let per = df
        .clone()
        .lazy()
        .group_by([col("repo_or_app"), col("instance_id")])
        .agg([col("success").any(false).alias("solved")])
        .group_by([col("repo_or_app")])
        .agg([
            len().alias("total"),
            col("solved").sum().alias("reproduced"),
        ])
        .sort(["repo_or_app"], SortMultipleOptions::default())
        .collect()?;
    let (names, total, reproduced) = (
        strs(&per, "repo_or_app")?,
        f64s(&per, "total")?,
        f64s(&per, "reproduced")?,
    );
    let mut t = Table::new(
        "Per repository",
        &[
            ("repo_or_app", "Repository / app"),
            ("total", "Total"),
            ("reproduced", "Reproduced"),
            ("rate_pct", "Rate (%)"),
        ],
    );
    for i in 0..per.height() {
        let (n, r) = (total[i].unwrap_or(0.0), reproduced[i].unwrap_or(0.0));
        t.push(vec![
            Cell::text(names[i].clone()),
            Cell::Int(n as i64),
            Cell::Int(r as i64),
            Cell::num(100.0 * r / n, 2),
        ]);
    }
    Ok(t)
}

/// Agent × backbone × dataset success rates, with their average over datasets.
pub fn backbone(df: &DataFrame) -> Result<Table, TableError> {
    let s = per_split(df, "dataset")?;
    let (a, v, b, d) = (
        strs(&s, "agent")?,
        strs(&s, "variant")?,
        strs(&s, "backbone")?,
        strs(&s, "dataset")?,
    );
    let sr = f64s(&s, "sr_mean")?;
    let datasets: BTreeSet<String> = d.iter().cloned().collect();
    let mut grid: BTreeMap<(String, String), BTreeMap<String, f64>> = BTreeMap::new();
    for i in 0..s.height() {
        if let Some(x) = sr[i] {
            grid.entry((label(&a[i], &v[i], "", false), b[i].clone()))
                .or_default()
                .insert(d[i].clone(), x);
        }
    }
    let mut cols: Vec<(String, String)> = vec![
        ("agent".into(), "Agent".into()),
        ("backbone".into(), "Backbone".into()),
    ];
    cols.extend(datasets.iter().map(|d| {
        (
            format!("sr_{}_pct", d.replace(['-', ':', ' '], "_")),
            d.clone(),
        )
    }));
    cols.push(("average_pct".into(), "Average".into()));
    let refs: Vec<(&str, &str)> = cols.iter().map(|(k, h)| (k.as_str(), h.as_str())).collect();
    let mut t = Table::new("Success rate (%) per backbone and dataset", &refs);
    for ((agent, bb), by_ds) in grid {
        let mut row = vec![Cell::text(agent), Cell::text(bb)];
        row.extend(
            datasets
                .iter()
                .map(|d| by_ds.get(d).map_or(Cell::Empty, |x| Cell::num(*x, 2))),
        );
        row.push(Cell::num(
            by_ds.values().sum::<f64>() / by_ds.len() as f64,
            2,
        ));
        t.push(row);
    }
    Ok(t)
}

/// Success rate split by correct and incorrect localization (SWT agents that report it).
pub fn localization(df: &DataFrame) -> Result<Table, TableError> {
    let known = df
        .clone()
        .lazy()
        .filter(col("localized_files_correct").is_not_null())
        .group_by([
            col("agent"),
            col("variant"),
            col("backbone"),
            col("localized_files_correct"),
        ])
        .agg([
            len().alias("tasks"),
            (col("success").cast(DataType::Float64).mean() * lit(100.0)).alias("sr"),
        ])
        .collect()?;
    if known.height() == 0 {
        return Err(TableError::NoLocalization);
    }
    let many = many_backbones(df)?;
    let (a, v, b) = (
        strs(&known, "agent")?,
        strs(&known, "variant")?,
        strs(&known, "backbone")?,
    );
    let flag = bools(&known, "localized_files_correct")?;
    let (tasks, sr) = (f64s(&known, "tasks")?, f64s(&known, "sr")?);
    let mut by: BTreeMap<String, [(f64, f64); 2]> = BTreeMap::new();
    for i in 0..known.height() {
        by.entry(label(&a[i], &v[i], &b[i], many)).or_default()[usize::from(flag[i])] =
            (tasks[i].unwrap_or(0.0), sr[i].unwrap_or(f64::NAN));
    }
    let mut t = Table::new(
        "Success rate by localization",
        &[
            ("approach", "Approach"),
            ("correct_tasks", "Correct: tasks"),
            ("correct_sr_pct", "Correct: SR (%)"),
            ("incorrect_tasks", "Incorrect: tasks"),
            ("incorrect_sr_pct", "Incorrect: SR (%)"),
        ],
    );
    for (name, [wrong, right]) in by {
        t.push(vec![
            Cell::text(name),
            Cell::Int(right.0 as i64),
            Cell::num(right.1, 2),
            Cell::Int(wrong.0 as i64),
            Cell::num(wrong.1, 2),
        ]);
    }
    Ok(t)
}

/// Cost per task and per success, and feedback iterations (mean, 90th percentile).
pub fn cost(df: &DataFrame) -> Result<Table, TableError> {
    let per = df
        .clone()
        .lazy()
        .group_by(CELL.map(col))
        .agg([
            len().alias("tasks"),
            col("success").sum().alias("successes"),
            col("cost_usd").sum().alias("cost"),
            (col("tokens_in") + col("tokens_out")).sum().alias("tokens"),
            col("feedback_iterations")
                .cast(DataType::Float64)
                .mean()
                .alias("fi_mean"),
            col("feedback_iterations")
                .cast(DataType::Float64)
                .quantile(lit(0.9), QuantileMethod::Linear)
                .alias("fi_p90"),
        ])
        .sort(CELL, SortMultipleOptions::default())
        .collect()?;
    let many = many_backbones(df)?;
    let (a, v, b) = (
        strs(&per, "agent")?,
        strs(&per, "variant")?,
        strs(&per, "backbone")?,
    );
    let (tasks, succ, cost, tokens) = (
        f64s(&per, "tasks")?,
        f64s(&per, "successes")?,
        f64s(&per, "cost")?,
        f64s(&per, "tokens")?,
    );
    let (fm, fp) = (f64s(&per, "fi_mean")?, f64s(&per, "fi_p90")?);
    let mut t = Table::new(
        "Cost",
        &[
            ("approach", "Approach"),
            ("tasks", "Tasks"),
            ("cost_per_task_usd", "$ / task"),
            ("cost_per_success_usd", "$ / success"),
            ("tokens_per_task_k", "Tokens (K) / task"),
            ("feedback_iterations_mean", "Feedback it. (mean)"),
            ("feedback_iterations_p90", "Feedback it. (p90)"),
        ],
    );
    for i in 0..per.height() {
        let n = tasks[i].unwrap_or(0.0);
        let s = succ[i].unwrap_or(0.0);
        let c = cost[i].unwrap_or(0.0);
        t.push(vec![
            Cell::text(label(&a[i], &v[i], &b[i], many)),
            Cell::Int(n as i64),
            Cell::num(c / n, 4),
            if s > 0.0 {
                Cell::num(c / s, 4)
            } else {
                Cell::Empty
            },
            Cell::num(tokens[i].unwrap_or(0.0) / n / 1000.0, 2),
            fm[i].map_or(Cell::Empty, |x| Cell::num(x, 2)),
            fp[i].map_or(Cell::Empty, |x| Cell::num(x, 2)),
        ]);
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::to_frame;
    use reprobench_domain::results::ResultRow;

    fn row(
        agent: &str,
        variant: &str,
        instance: &str,
        repeat: u32,
        success: bool,
        bug: &str,
    ) -> ResultRow {
        ResultRow {
            agent: agent.into(),
            variant: variant.into(),
            backbone: "m".into(),
            dataset: "d".into(),
            instance_id: instance.into(),
            repo_or_app: format!("app-{}", &instance[..1]),
            repeat,
            success,
            bug_type: Some(bug.into()),
            actions: Some(10),
            tokens_in: 1500,
            tokens_out: 500,
            cost_usd: 0.5,
            wall_s: 120.0,
            ..Default::default()
        }
    }

    fn data() -> DataFrame {
        let mut rows = Vec::new();
        for rep in 0..2 {
            rows.push(row("x", "full", "a1", rep, true, "crash"));
            rows.push(row("x", "full", "b1", rep, rep == 0, "non-crash"));
            rows.push(row("x", "no-ra", "a1", rep, true, "crash"));
            rows.push(row("x", "no-ra", "b1", rep, false, "non-crash"));
        }
        to_frame(&rows).unwrap()
    }

    #[test]
    fn main_table_averages_repeats_and_splits_by_bug_type() {
        let published =
            parse_published("Method,overall_sr_pct,crash_sr_pct\nPaper,40,50\n").unwrap();
        let t = main(
            &data(),
            &TableOptions {
                reference: Some("x".into()),
                published,
            },
        )
        .unwrap();
        let j = crate::table::json(&t);
        let full = &j[0];
        assert_eq!(full["method"], "x");
        assert_eq!(full["success_rate_pct"], 75.0); // 100% and 50% over two repeats
        assert!((full["success_rate_pct_std"].as_f64().unwrap() - 35.355).abs() < 0.01);
        assert_eq!(full["crash_sr_pct"], 100.0);
        assert_eq!(full["noncrash_sr_pct"], 50.0);
        assert_eq!(full["tokens_k"], 2.0);
        assert_eq!(full["time_min"], 2.0);
        assert_eq!(j[1]["method"], "x/no-ra");
        assert_eq!(j[1]["relative_improvement_pct"], 50.0); // (75 − 50) / 50
        assert_eq!(j[2]["source"], "published");
        assert_eq!(j[2]["relative_improvement_pct"], 87.5); // (75 − 40) / 40
        assert!(
            main(
                &data(),
                &TableOptions {
                    reference: Some("nope".into()),
                    published: vec![]
                }
            )
            .is_err()
        );
    }

    #[test]
    fn ablation_overlap_repo_and_cost() {
        let df = data();
        let ab = crate::table::json(&ablation(&df).unwrap()[0]);
        assert_eq!(ab[1]["drop_pp"], 25.0);
        let ov = overlap(&df).unwrap();
        let per = crate::table::json(&ov[0]);
        assert_eq!(
            (
                per[0]["solved"].as_i64(),
                per[0]["uniquely_solved"].as_i64()
            ),
            (Some(2), Some(1))
        );
        assert_eq!(
            (
                per[1]["solved"].as_i64(),
                per[1]["uniquely_solved"].as_i64()
            ),
            (Some(1), Some(0))
        );
        assert_eq!(crate::table::json(&ov[1])[0]["intersection"], 1);
        let r = crate::table::json(&repo(&df).unwrap());
        assert_eq!(
            (r[0]["total"].as_i64(), r[0]["reproduced"].as_i64()),
            (Some(1), Some(1))
        );
        let c = crate::table::json(&cost(&df).unwrap());
        assert_eq!(c[0]["cost_per_task_usd"], 0.5);
        assert_eq!(c[0]["cost_per_success_usd"], 4.0 * 0.5 / 3.0);
        assert!(localization(&df).is_err(), "no localization data");
    }

    #[test]
    fn error_messages_read_as_before() {
        let published = |text: &str| parse_published(text).unwrap_err().to_string();
        assert_eq!(published("\n"), "the published CSV is empty");
        assert_eq!(
            published("name,overall_sr_pct\n"),
            "the published CSV needs a `Method` column (and numeric columns such as overall_sr_pct, crash_sr_pct, actions, tokens_k, cost_usd, time_min)"
        );
        assert_eq!(
            published("Method,actions\nP,1\nQ,many\n"),
            "published CSV line 3: `many` in column actions is not a number"
        );
        let df = data();
        let opts = TableOptions::default();
        assert_eq!(
            build("pie", &df, &opts).unwrap_err().to_string(),
            "unknown table kind `pie`; use one of main, ablation, repo, backbone, overlap, localization, cost"
        );
        let with_reference = |name: &str| TableOptions {
            reference: Some(name.into()),
            published: parse_published("Method,actions\nPaper,3\n").unwrap(),
        };
        assert_eq!(
            main(&df, &with_reference("nope")).unwrap_err().to_string(),
            "--reference `nope` is not a row; rows are: x, x/no-ra, Paper"
        );
        assert_eq!(
            main(&df, &with_reference("Paper")).unwrap_err().to_string(),
            "--reference `Paper` has no overall success rate"
        );
        let variants_only = to_frame(&[row("x", "no-ra", "a1", 0, true, "crash")]).unwrap();
        assert_eq!(
            ablation(&variants_only).unwrap_err().to_string(),
            "no `full` variant in these results: the ablation table compares the full agent with its variants"
        );
        assert_eq!(
            localization(&df).unwrap_err().to_string(),
            "no result reports localized_files_correct; the localization table needs an agent that localizes (reproagent)"
        );
    }
}
