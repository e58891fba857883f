//! Results in polars: the results schema as a `DataFrame`, read from JSONL or Parquet files and
//! written to Parquet. Analysis reads only this schema, so results from any source can be tabulated.

use polars::prelude::*;
use reprobench_proto::v1::ResultRow;
use std::path::Path;

/// Columns of the results schema (DESIGN.md), in order.
pub const COLUMNS: &[&str] = &[
    "run_id",
    "sweep",
    "track",
    "dataset",
    "instance_id",
    "repo_or_app",
    "bug_type",
    "agent",
    "variant",
    "backbone",
    "repeat",
    "success",
    "verdict",
    "error_class",
    "error_message",
    "rules",
    "coverage_delta",
    "attempts",
    "llm_calls",
    "tokens_in",
    "tokens_out",
    "tokens_cached",
    "cost_usd",
    "wall_s",
    "actions",
    "trace_len",
    "ground_truth_actions",
    "feedback_iterations",
    "localized_files_correct",
    "started_at",
    "finished_at",
    "node_id",
    "artifact_path",
];

/// Columns added after the first release; files without them read them as nulls.
const LATER_COLUMNS: &[(&str, DataType)] = &[
    ("error_message", DataType::String),
    ("rules", DataType::String),
    ("coverage_delta", DataType::Float64),
];

/// Result rows as a DataFrame with the schema's column names and types.
pub fn to_frame(rows: &[ResultRow]) -> PolarsResult<DataFrame> {
    fn text(name: &str, rows: &[ResultRow], f: impl Fn(&ResultRow) -> &str) -> Column {
        Column::new(name.into(), rows.iter().map(f).collect::<Vec<&str>>())
    }
    fn opt_text(name: &str, rows: &[ResultRow], f: impl Fn(&ResultRow) -> Option<&str>) -> Column {
        Column::new(
            name.into(),
            rows.iter().map(f).collect::<Vec<Option<&str>>>(),
        )
    }
    fn u64s(name: &str, rows: &[ResultRow], f: impl Fn(&ResultRow) -> u64) -> Column {
        Column::new(name.into(), rows.iter().map(f).collect::<Vec<u64>>())
    }
    fn opt_u32(name: &str, rows: &[ResultRow], f: impl Fn(&ResultRow) -> Option<u32>) -> Column {
        Column::new(
            name.into(),
            rows.iter().map(f).collect::<Vec<Option<u32>>>(),
        )
    }
    fn f64s(name: &str, rows: &[ResultRow], f: impl Fn(&ResultRow) -> f64) -> Column {
        Column::new(name.into(), rows.iter().map(f).collect::<Vec<f64>>())
    }
    let columns = vec![
        text("run_id", rows, |r| &r.run_id),
        text("sweep", rows, |r| &r.sweep),
        text("track", rows, |r| &r.track),
        text("dataset", rows, |r| &r.dataset),
        text("instance_id", rows, |r| &r.instance_id),
        text("repo_or_app", rows, |r| &r.repo_or_app),
        opt_text("bug_type", rows, |r| r.bug_type.as_deref()),
        text("agent", rows, |r| &r.agent),
        text("variant", rows, |r| &r.variant),
        text("backbone", rows, |r| &r.backbone),
        Column::new(
            "repeat".into(),
            rows.iter().map(|r| r.repeat).collect::<Vec<u32>>(),
        ),
        Column::new(
            "success".into(),
            rows.iter().map(|r| r.success).collect::<Vec<bool>>(),
        ),
        text("verdict", rows, |r| &r.verdict),
        opt_text("error_class", rows, |r| r.error_class.as_deref()),
        opt_text("error_message", rows, |r| r.error_message.as_deref()),
        opt_text("rules", rows, |r| r.rules.as_deref()),
        Column::new(
            "coverage_delta".into(),
            rows.iter()
                .map(|r| r.coverage_delta)
                .collect::<Vec<Option<f64>>>(),
        ),
        Column::new(
            "attempts".into(),
            rows.iter().map(|r| r.attempts).collect::<Vec<u32>>(),
        ),
        u64s("llm_calls", rows, |r| r.llm_calls),
        u64s("tokens_in", rows, |r| r.tokens_in),
        u64s("tokens_out", rows, |r| r.tokens_out),
        u64s("tokens_cached", rows, |r| r.tokens_cached),
        f64s("cost_usd", rows, |r| r.cost_usd),
        f64s("wall_s", rows, |r| r.wall_s),
        opt_u32("actions", rows, |r| r.actions),
        opt_u32("trace_len", rows, |r| r.trace_len),
        opt_u32("ground_truth_actions", rows, |r| r.ground_truth_actions),
        opt_u32("feedback_iterations", rows, |r| r.feedback_iterations),
        Column::new(
            "localized_files_correct".into(),
            rows.iter()
                .map(|r| r.localized_files_correct)
                .collect::<Vec<Option<bool>>>(),
        ),
        text("started_at", rows, |r| &r.started_at),
        text("finished_at", rows, |r| &r.finished_at),
        text("node_id", rows, |r| &r.node_id),
        text("artifact_path", rows, |r| &r.artifact_path),
    ];
    DataFrame::new(rows.len(), columns)
}

/// Reads results files (JSONL, JSON array, or Parquet) into one DataFrame. Bad JSON lines are
/// reported in the error with their location; a file missing a schema column is refused by name.
pub fn load(paths: &[impl AsRef<Path>]) -> Result<DataFrame, String> {
    let mut frames: Vec<DataFrame> = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let df = if p.extension().is_some_and(|e| e == "parquet") {
            let file =
                std::fs::File::open(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let mut df = ParquetReader::new(file)
                .finish()
                .map_err(|e| format!("{}: not a readable Parquet file: {e}", p.display()))?;
            // Columns added to the schema later are null in files written before them.
            for (c, kind) in LATER_COLUMNS {
                if df.column(c).is_err() {
                    df.with_column(Column::full_null((*c).into(), df.height(), kind))
                        .map_err(|e| e.to_string())?;
                }
            }
            for c in COLUMNS {
                if df.column(c).is_err() {
                    return Err(format!(
                        "{}: column `{c}` of the results schema is missing; export results with `reprobench results RUN --format parquet`",
                        p.display()
                    ));
                }
            }
            df.select(COLUMNS.iter().copied())
                .map_err(|e| e.to_string())?
        } else {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            let rows = parse_jsonl(&p.display().to_string(), &text)?;
            to_frame(&rows).map_err(|e| e.to_string())?
        };
        frames.push(df);
    }
    let mut iter = frames.into_iter();
    let mut all = iter
        .next()
        .ok_or("no results file given; pass --results FILE")?;
    for df in iter {
        all.vstack_mut(&df)
            .map_err(|e| format!("results files disagree on column types: {e}"))?;
    }
    Ok(all)
}

/// Columns a result row must have: an object without them is not a result row (a predictions
/// file, say), and a null in one of them is an error.
pub const REQUIRED_COLUMNS: &[&str] = &[
    "run_id",
    "dataset",
    "instance_id",
    "agent",
    "variant",
    "success",
    "verdict",
];

/// Parses result rows from JSONL (or a JSON array); every bad line is an error naming it.
/// Required columns must be there and not null; other columns may be null (read as empty) or
/// missing; columns outside the schema are ignored, with one warning per file on stderr.
pub fn parse_jsonl(name: &str, text: &str) -> Result<Vec<ResultRow>, String> {
    let mut unknown = std::collections::BTreeSet::new();
    let mut rows = Vec::new();
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| format!("{name}: not a JSON array of result rows: {e}"))?;
        for (i, v) in values.into_iter().enumerate() {
            rows.push(row_from_value(v, &mut unknown).map_err(|e| {
                format!(
                    "{name}: element {i} of the array: not a result row ({e}); fix or delete it"
                )
            })?);
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let row = serde_json::from_str(line)
                .map_err(|e| e.to_string())
                .and_then(|v| row_from_value(v, &mut unknown));
            rows.push(row.map_err(|e| {
                format!(
                    "{name}:{}: not a result row ({e}); fix or delete this line",
                    i + 1
                )
            })?);
        }
    }
    if !unknown.is_empty() {
        let list: Vec<&str> = unknown.iter().map(String::as_str).collect();
        eprintln!(
            "warning: {name}: ignoring columns that are not in the results schema: {}",
            list.join(", ")
        );
    }
    Ok(rows)
}

/// One JSON object as a result row (see [`parse_jsonl`] for the rules); `unknown` collects the
/// names of columns outside the schema.
fn row_from_value(
    v: serde_json::Value,
    unknown: &mut std::collections::BTreeSet<String>,
) -> Result<ResultRow, String> {
    let serde_json::Value::Object(mut obj) = v else {
        return Err("a JSON object per row is expected".into());
    };
    for col in REQUIRED_COLUMNS {
        match obj.get(*col) {
            None => return Err(format!("missing column `{col}`")),
            Some(serde_json::Value::Null) => return Err(format!("column `{col}` is null")),
            Some(_) => {}
        }
    }
    // A null in a nullable column reads as its empty value; `details_json` never travels in rows.
    obj.retain(|k, v| {
        let known = COLUMNS.contains(&k.as_str());
        if !known && k != "details_json" {
            unknown.insert(k.clone());
        }
        known && !v.is_null()
    });
    serde_json::from_value(serde_json::Value::Object(obj)).map_err(|e| e.to_string())
}

/// Reads result rows from files (JSONL, JSON array, or Parquet) into the schema's rows.
pub fn load_rows(paths: &[impl AsRef<Path>]) -> Result<Vec<ResultRow>, String> {
    let mut rows = Vec::new();
    for p in paths {
        let p = p.as_ref();
        if p.extension().is_some_and(|e| e == "parquet") {
            rows.extend(to_rows(&load(&[p])?).map_err(|e| e.to_string())?);
        } else {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            rows.extend(parse_jsonl(&p.display().to_string(), &text)?);
        }
    }
    Ok(rows)
}

/// A DataFrame in the results schema back to rows.
pub fn to_rows(df: &DataFrame) -> PolarsResult<Vec<ResultRow>> {
    let s = |n: &str| -> PolarsResult<Vec<String>> {
        Ok(df
            .column(n)?
            .str()?
            .iter()
            .map(|v| v.unwrap_or("").to_string())
            .collect())
    };
    let os = |n: &str| -> PolarsResult<Vec<Option<String>>> {
        Ok(df
            .column(n)?
            .str()?
            .iter()
            .map(|v| v.map(str::to_string))
            .collect())
    };
    let u = |n: &str| -> PolarsResult<Vec<Option<u64>>> {
        Ok(df
            .column(n)?
            .cast(&DataType::UInt64)?
            .u64()?
            .iter()
            .collect())
    };
    let f = |n: &str| -> PolarsResult<Vec<f64>> {
        Ok(df
            .column(n)?
            .cast(&DataType::Float64)?
            .f64()?
            .iter()
            .map(|v| v.unwrap_or(0.0))
            .collect())
    };
    let b =
        |n: &str| -> PolarsResult<Vec<Option<bool>>> { Ok(df.column(n)?.bool()?.iter().collect()) };
    let (run_id, sweep, track, dataset, instance_id, repo) = (
        s("run_id")?,
        s("sweep")?,
        s("track")?,
        s("dataset")?,
        s("instance_id")?,
        s("repo_or_app")?,
    );
    let (bug_type, agent, variant, backbone, verdict, error_class) = (
        os("bug_type")?,
        s("agent")?,
        s("variant")?,
        s("backbone")?,
        s("verdict")?,
        os("error_class")?,
    );
    let (error_message, rules) = (os("error_message")?, os("rules")?);
    let coverage_delta: Vec<Option<f64>> = df
        .column("coverage_delta")?
        .cast(&DataType::Float64)?
        .f64()?
        .iter()
        .collect();
    let (repeat, attempts, llm_calls, t_in, t_out, t_cached) = (
        u("repeat")?,
        u("attempts")?,
        u("llm_calls")?,
        u("tokens_in")?,
        u("tokens_out")?,
        u("tokens_cached")?,
    );
    let (actions, trace_len, gta, fi) = (
        u("actions")?,
        u("trace_len")?,
        u("ground_truth_actions")?,
        u("feedback_iterations")?,
    );
    let (cost, wall, success, loc) = (
        f("cost_usd")?,
        f("wall_s")?,
        b("success")?,
        b("localized_files_correct")?,
    );
    let (started, finished, node, artifact) = (
        s("started_at")?,
        s("finished_at")?,
        s("node_id")?,
        s("artifact_path")?,
    );
    let n32 = |v: Option<u64>| v.map(|x| x as u32);
    Ok((0..df.height())
        .map(|i| ResultRow {
            run_id: run_id[i].clone(),
            sweep: sweep[i].clone(),
            track: track[i].clone(),
            dataset: dataset[i].clone(),
            instance_id: instance_id[i].clone(),
            repo_or_app: repo[i].clone(),
            bug_type: bug_type[i].clone(),
            agent: agent[i].clone(),
            variant: variant[i].clone(),
            backbone: backbone[i].clone(),
            repeat: n32(repeat[i]).unwrap_or(0),
            success: success[i].unwrap_or(false),
            verdict: verdict[i].clone(),
            error_class: error_class[i].clone(),
            error_message: error_message[i].clone(),
            rules: rules[i].clone(),
            coverage_delta: coverage_delta[i],
            attempts: n32(attempts[i]).unwrap_or(0),
            llm_calls: llm_calls[i].unwrap_or(0),
            tokens_in: t_in[i].unwrap_or(0),
            tokens_out: t_out[i].unwrap_or(0),
            tokens_cached: t_cached[i].unwrap_or(0),
            cost_usd: cost[i],
            wall_s: wall[i],
            actions: n32(actions[i]),
            trace_len: n32(trace_len[i]),
            ground_truth_actions: n32(gta[i]),
            feedback_iterations: n32(fi[i]),
            localized_files_correct: loc[i],
            started_at: started[i].clone(),
            finished_at: finished[i].clone(),
            node_id: node[i].clone(),
            artifact_path: artifact[i].clone(),
            details_json: String::new(),
        })
        .collect())
}

/// Writes result rows as Parquet.
pub fn write_parquet(rows: &[ResultRow], out: impl std::io::Write) -> Result<(), String> {
    let mut df = to_frame(rows).map_err(|e| e.to_string())?;
    ParquetWriter::new(out)
        .finish(&mut df)
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_need_their_required_columns_and_take_nulls_and_unknown_columns() {
        let row = r#"{"run_id":"r","dataset":"d","instance_id":"i","agent":"a","variant":"full","success":true,"verdict":"F->P","artifact_path":null,"error_class":null,"wall_s":null,"extra":1}"#;
        let rows = parse_jsonl("results.jsonl", row).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].artifact_path, "");
        assert!(rows[0].success);

        // A predictions file is not a table of zeros.
        let pred = "\n{\"instance_id\":\"i\",\"model_name_or_path\":\"m\",\"model_patch\":\"\"}";
        let err = parse_jsonl("preds.jsonl", pred).unwrap_err();
        assert!(
            err.starts_with("preds.jsonl:2:") && err.contains("missing column `run_id`"),
            "{err}"
        );
        let null_required = row.replace(r#""verdict":"F->P""#, r#""verdict":null"#);
        let err = parse_jsonl("r.jsonl", &null_required).unwrap_err();
        assert!(err.contains("column `verdict` is null"), "{err}");
        let err = parse_jsonl("a.json", &format!("[{row}, 3]")).unwrap_err();
        assert!(err.contains("element 1"), "{err}");
    }

    #[test]
    fn jsonl_and_parquet_round_trip_through_the_schema() {
        let rows: Vec<ResultRow> = (0..3)
            .map(|i| ResultRow {
                instance_id: format!("i{i}"),
                agent: "a".into(),
                success: i % 2 == 0,
                actions: (i > 0).then_some(i),
                bug_type: Some("crash".into()),
                ..Default::default()
            })
            .collect();
        let df = to_frame(&rows).unwrap();
        assert_eq!(df.height(), 3);
        assert_eq!(df.get_column_names().len(), COLUMNS.len());
        let dir = std::env::temp_dir().join(format!("reprobench-frame-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pq = dir.join("r.parquet");
        write_parquet(&rows, std::fs::File::create(&pq).unwrap()).unwrap();
        let jl = dir.join("r.jsonl");
        std::fs::write(
            &jl,
            rows.iter()
                .map(|r| serde_json::to_string(r).unwrap() + "\n")
                .collect::<String>(),
        )
        .unwrap();
        let both = load(&[pq, jl.clone()]).unwrap();
        assert_eq!(both.height(), 6);
        std::fs::write(&jl, "{\"agent\": 3}\n").unwrap();
        let err = load(&[jl]).unwrap_err();
        assert!(err.contains("r.jsonl:1"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
