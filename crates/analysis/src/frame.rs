//! Results in polars: the results schema as a `DataFrame`, read from JSONL or Parquet files and
//! written to Parquet. Analysis reads only this schema, so results from any source can be tabulated.

use polars::prelude::*;
use reprobench_domain::results::{NewerSchema, ResultRow, SCHEMA_VERSION, SchemaVersion};
use std::path::{Path, PathBuf};

// The messages below already include the errors they wrap, so none is exposed as a `source`: a
// reporter printing the chain (anyhow's `{:#}`) would repeat it.

/// Why results files could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// A file could not be read.
    #[error("cannot read {}: {error}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What reading it gave.
        error: std::io::Error,
    },
    /// A `.parquet` file that Parquet cannot read.
    #[error("{}: not a readable Parquet file: {error}", .path.display())]
    NotParquet {
        /// The file.
        path: PathBuf,
        /// What the Parquet reader said.
        error: PolarsError,
    },
    /// A Parquet file without a column of the results schema.
    #[error(
        "{}: column `{column}` of the results schema is missing; export results with `reprobench results RUN --format parquet`",
        .path.display()
    )]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The missing column.
        column: &'static str,
    },
    /// A Parquet file with rows of a newer schema than this build reads.
    #[error("{}: {newer}", .path.display())]
    SchemaTooNew {
        /// The file.
        path: PathBuf,
        /// The newest version found in it.
        newer: NewerSchema,
    },
    /// A file starting with `[` that is not a JSON array.
    #[error("{name}: not a JSON array of result rows: {error}")]
    NotAJsonArray {
        /// The file's name.
        name: String,
        /// What the JSON parser said.
        error: serde_json::Error,
    },
    /// An element of a JSON array that is not a result row.
    #[error("{name}: element {index} of the array: not a result row ({row}); fix or delete it")]
    BadArrayElement {
        /// The file's name.
        name: String,
        /// The element's position, from 0.
        index: usize,
        /// What is wrong with it.
        row: RowError,
    },
    /// A JSONL line that is not a result row.
    #[error("{name}:{line}: not a result row ({row}); fix or delete this line")]
    BadLine {
        /// The file's name.
        name: String,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        row: RowError,
    },
    /// No file was given.
    #[error("no results file given; pass --results FILE")]
    NoResultsFiles,
    /// Files whose columns have different types.
    #[error("results files disagree on column types: {0}")]
    ColumnTypesDisagree(PolarsError),
    /// Any other polars failure.
    #[error("{0}")]
    Polars(PolarsError),
}

/// Why one JSON value is not a result row.
#[derive(Debug, thiserror::Error)]
pub enum RowError {
    /// The line is not JSON.
    #[error("{0}")]
    NotJson(serde_json::Error),
    /// The value is not an object.
    #[error("a JSON object per row is expected")]
    NotAnObject,
    /// A required column is absent.
    #[error("missing column `{column}`")]
    MissingColumn {
        /// The column.
        column: &'static str,
    },
    /// A required column is null.
    #[error("column `{column}` is null")]
    NullColumn {
        /// The column.
        column: &'static str,
    },
    /// A column holds a value of the wrong type.
    #[error("{0}")]
    BadValue(serde_json::Error),
    /// The row's schema is newer than this build reads.
    #[error("{0}")]
    SchemaTooNew(NewerSchema),
}

/// Columns of the results schema (DESIGN.md), in order.
pub const COLUMNS: &[&str] = &[
    "schema_version",
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
    ("schema_version", DataType::UInt32),
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
        Column::new(
            "schema_version".into(),
            rows.iter()
                .map(|r| r.schema_version.0)
                .collect::<Vec<u32>>(),
        ),
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
pub fn load(paths: &[impl AsRef<Path>]) -> Result<DataFrame, FrameError> {
    let mut frames: Vec<DataFrame> = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let df = if p.extension().is_some_and(|e| e == "parquet") {
            let file = std::fs::File::open(p).map_err(|error| read_error(p, error))?;
            let mut df =
                ParquetReader::new(file)
                    .finish()
                    .map_err(|error| FrameError::NotParquet {
                        path: p.into(),
                        error,
                    })?;
            // Columns added to the schema later are null in files written before them.
            for (c, kind) in LATER_COLUMNS {
                if df.column(c).is_err() {
                    df.with_column(Column::full_null((*c).into(), df.height(), kind))
                        .map_err(FrameError::Polars)?;
                }
            }
            for c in COLUMNS {
                if df.column(c).is_err() {
                    return Err(FrameError::MissingColumn {
                        path: p.into(),
                        column: c,
                    });
                }
            }
            let newest = df
                .column("schema_version")
                .and_then(|c| c.cast(&DataType::UInt32))
                .map_err(FrameError::Polars)?
                .u32()
                .map_err(FrameError::Polars)?
                .max();
            if let Some(found) = newest.filter(|v| *v > SCHEMA_VERSION) {
                return Err(FrameError::SchemaTooNew {
                    path: p.into(),
                    newer: NewerSchema { found },
                });
            }
            df.select(COLUMNS.iter().copied())
                .map_err(FrameError::Polars)?
        } else {
            let text = std::fs::read_to_string(p).map_err(|error| read_error(p, error))?;
            let rows = parse_jsonl(&p.display().to_string(), &text)?;
            to_frame(&rows).map_err(FrameError::Polars)?
        };
        frames.push(df);
    }
    let mut iter = frames.into_iter();
    let mut all = iter.next().ok_or(FrameError::NoResultsFiles)?;
    for df in iter {
        all.vstack_mut(&df)
            .map_err(FrameError::ColumnTypesDisagree)?;
    }
    Ok(all)
}

/// The error of a file that could not be read.
fn read_error(path: &Path, error: std::io::Error) -> FrameError {
    FrameError::Read {
        path: path.into(),
        error,
    }
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
pub fn parse_jsonl(name: &str, text: &str) -> Result<Vec<ResultRow>, FrameError> {
    let mut unknown = std::collections::BTreeSet::new();
    let mut rows = Vec::new();
    if text.trim_start().starts_with('[') {
        let values: Vec<serde_json::Value> =
            serde_json::from_str(text).map_err(|error| FrameError::NotAJsonArray {
                name: name.into(),
                error,
            })?;
        for (index, v) in values.into_iter().enumerate() {
            rows.push(row_from_value(v, &mut unknown).map_err(|row| {
                FrameError::BadArrayElement {
                    name: name.into(),
                    index,
                    row,
                }
            })?);
        }
    } else {
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let row = serde_json::from_str(line)
                .map_err(RowError::NotJson)
                .and_then(|v| row_from_value(v, &mut unknown));
            rows.push(row.map_err(|row| FrameError::BadLine {
                name: name.into(),
                line: i + 1,
                row,
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
) -> Result<ResultRow, RowError> {
    let serde_json::Value::Object(mut obj) = v else {
        return Err(RowError::NotAnObject);
    };
    for column in REQUIRED_COLUMNS {
        match obj.get(*column) {
            None => return Err(RowError::MissingColumn { column }),
            Some(serde_json::Value::Null) => return Err(RowError::NullColumn { column }),
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
    let row: ResultRow =
        serde_json::from_value(serde_json::Value::Object(obj)).map_err(RowError::BadValue)?;
    row.checked().map_err(RowError::SchemaTooNew)
}

/// Reads result rows from files (JSONL, JSON array, or Parquet) into the schema's rows.
pub fn load_rows(paths: &[impl AsRef<Path>]) -> Result<Vec<ResultRow>, FrameError> {
    let mut rows = Vec::new();
    for p in paths {
        let p = p.as_ref();
        if p.extension().is_some_and(|e| e == "parquet") {
            rows.extend(to_rows(&load(&[p])?).map_err(FrameError::Polars)?);
        } else {
            let text = std::fs::read_to_string(p).map_err(|error| read_error(p, error))?;
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
    let versions = u("schema_version")?;
    Ok((0..df.height())
        .map(|i| ResultRow {
            schema_version: n32(versions[i]).map(SchemaVersion).unwrap_or_default(),
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
pub fn write_parquet(rows: &[ResultRow], out: impl std::io::Write) -> Result<(), FrameError> {
    let mut df = to_frame(rows).map_err(FrameError::Polars)?;
    ParquetWriter::new(out)
        .finish(&mut df)
        .map_err(FrameError::Polars)?;
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
        let err = parse_jsonl("preds.jsonl", pred).unwrap_err().to_string();
        assert!(
            err.starts_with("preds.jsonl:2:") && err.contains("missing column `run_id`"),
            "{err}"
        );
        let null_required = row.replace(r#""verdict":"F->P""#, r#""verdict":null"#);
        let err = parse_jsonl("r.jsonl", &null_required)
            .unwrap_err()
            .to_string();
        assert!(err.contains("column `verdict` is null"), "{err}");
        let err = parse_jsonl("a.json", &format!("[{row}, 3]"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("element 1"), "{err}");
    }

    /// A column added to `ResultRow` but not here would be left out of frames and CSV exports
    /// silently; this makes it a failing test instead.
    #[test]
    fn the_columns_are_every_field_a_result_row_writes() {
        let written = serde_json::to_value(ResultRow::default()).unwrap();
        let mut fields: Vec<&str> = written
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut columns = COLUMNS.to_vec();
        fields.sort_unstable();
        columns.sort_unstable();
        assert_eq!(fields, columns);
        let df = to_frame(&[ResultRow::default()]).unwrap();
        let names: Vec<&str> = df.get_column_names().iter().map(|n| n.as_str()).collect();
        assert_eq!(names, COLUMNS, "the frame has every column, in order");
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
        let err = load(&[jl]).unwrap_err().to_string();
        assert!(err.contains("r.jsonl:1"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn error_messages_read_as_before() {
        let message = |text: &str| parse_jsonl("f.jsonl", text).unwrap_err().to_string();
        assert_eq!(
            message("3"),
            "f.jsonl:1: not a result row (a JSON object per row is expected); fix or delete this line"
        );
        assert_eq!(
            message("\n{}"),
            "f.jsonl:2: not a result row (missing column `run_id`); fix or delete this line"
        );
        let json_error = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        assert_eq!(
            message("{"),
            format!("f.jsonl:1: not a result row ({json_error}); fix or delete this line")
        );
        let array_error = serde_json::from_str::<Vec<serde_json::Value>>("[1,").unwrap_err();
        assert_eq!(
            message("[1,"),
            format!("f.jsonl: not a JSON array of result rows: {array_error}")
        );
        let row = r#"{"run_id":"r","dataset":"d","instance_id":"i","agent":"a","variant":"v","success":true,"verdict":null}"#;
        assert_eq!(
            message(&format!("[{row}]")),
            "f.jsonl: element 0 of the array: not a result row (column `verdict` is null); fix or delete it"
        );
        let newer = row.replace(
            r#""verdict":null"#,
            r#""verdict":"x","schema_version":4000000000"#,
        );
        assert_eq!(
            message(&newer),
            format!(
                "f.jsonl:1: not a result row ({}); fix or delete this line",
                NewerSchema { found: 4000000000 }
            )
        );

        let dir =
            std::env::temp_dir().join(format!("reprobench-frame-errors-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let absent = dir.join("absent.jsonl");
        let io_error = std::fs::read_to_string(&absent).unwrap_err();
        assert_eq!(
            load(&[&absent]).unwrap_err().to_string(),
            format!("cannot read {}: {io_error}", absent.display())
        );
        assert_eq!(
            load_rows(&[&absent]).unwrap_err().to_string(),
            format!("cannot read {}: {io_error}", absent.display())
        );
        assert_eq!(
            load(&[] as &[&Path]).unwrap_err().to_string(),
            "no results file given; pass --results FILE"
        );
        let rows = vec![ResultRow {
            schema_version: SchemaVersion(SCHEMA_VERSION + 1),
            ..Default::default()
        }];
        let pq = dir.join("newer.parquet");
        write_parquet(&rows, std::fs::File::create(&pq).unwrap()).unwrap();
        assert_eq!(
            load(&[&pq]).unwrap_err().to_string(),
            format!(
                "{}: {}",
                pq.display(),
                NewerSchema {
                    found: SCHEMA_VERSION + 1
                }
            )
        );
        let mut df = to_frame(&[ResultRow::default()])
            .unwrap()
            .drop("verdict")
            .unwrap();
        let pq = dir.join("old.parquet");
        ParquetWriter::new(std::fs::File::create(&pq).unwrap())
            .finish(&mut df)
            .unwrap();
        assert_eq!(
            load(&[&pq]).unwrap_err().to_string(),
            format!(
                "{}: column `verdict` of the results schema is missing; export results with `reprobench results RUN --format parquet`",
                pq.display()
            )
        );
        let not_parquet = dir.join("text.parquet");
        std::fs::write(&not_parquet, "not parquet").unwrap();
        let err = load(&[&not_parquet]).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "{}: not a readable Parquet file: ",
                not_parquet.display()
            )),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
