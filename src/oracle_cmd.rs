//! `reprobench oracle`: a stand-in backbone that plays a perfect model from golden patches and
//! ground-truth traces (never a language model, never a default backbone), served as an
//! OpenAI-compatible endpoint for sweeps that prove the pipeline from agent to verdict.

use anyhow::{Context, Result, bail};
use clap::Args;
use reprobench_agents::oracle::{ORACLE_NOTE, OracleCase, SwtOracle};
use reprobench_domain::swt::{SwtInstance, load_rows, mirror_name};
use reprobench_gateway::scripted::{Keep, ScriptedReply, ScriptedUpstream, UpstreamIdentity};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::PathBuf;

/// How oracle answers name themselves.
const ORACLE: UpstreamIdentity = UpstreamIdentity {
    fingerprint: "reprobench-oracle",
    note: ORACLE_NOTE,
};

/// Options of `reprobench oracle`.
#[derive(Args)]
pub struct OracleArgs {
    /// SWT rows (SWE-bench's schema, JSON lines or Parquet) whose golden patches the oracle
    /// knows; repeat for several files.
    #[arg(long, value_name = "ROWS")]
    swt: Vec<PathBuf>,
    /// The repositories' bare mirrors (`OWNER__NAME.git`, as `datasets import` unpacks them),
    /// read for the golden test files at their base commits.
    #[arg(long, value_name = "DIR", default_value = "datasets/repos")]
    repos: PathBuf,
    /// android-sim dataset directories whose reports' ground-truth traces the oracle knows;
    /// repeat for several.
    #[arg(long, value_name = "DIR")]
    android: Vec<PathBuf>,
    /// Address to listen on (port 0: a free port). Its base URL is printed on stdout.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

/// The oracle's answer to one request: the SWT oracle's, else the Android oracle's, else a 400
/// that says the request is none it knows.
fn respond(
    swt: &SwtOracle,
    android: &[reprobench_android::oracle::AndroidOracle],
    body: &Value,
) -> ScriptedReply {
    let message = swt
        .answer(body)
        .or_else(|| android.iter().find_map(|o| o.answer(body)));
    match message {
        Some(m) => ScriptedReply::Message {
            content: m["content"].as_str().map(str::to_string),
            tool_calls: m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| serde_json::from_value(c.clone()).ok())
                .collect(),
            prompt_tokens: 10,
            completion_tokens: 5,
            cached_tokens: 0,
        },
        None => ScriptedReply::Status {
            code: 400,
            retry_after_s: None,
            body: json!({"error": {
                "message": "the reprobench oracle knows no agent protocol or instance in this request (it answers reprobench's built-in agents on the instances and reports it was started with)",
                "type": "invalid_request_error", "code": "oracle_unknown_request"}})
            .to_string(),
        },
    }
}

/// The SWT oracle's cases for the rows of `files`, their test files read from `repos`.
fn swt_cases(files: &[PathBuf], repos: &std::path::Path) -> Result<Vec<OracleCase>> {
    let mut cases = Vec::new();
    for file in files {
        let parsed = load_rows::<SwtInstance>(file)
            .with_context(|| format!("cannot read SWT rows from {}", file.display()))?;
        if let Some(e) = parsed.errors.first() {
            bail!(
                "{}: {} rows cannot be read (first: {e:?}); give rows in SWE-bench's schema",
                file.display(),
                parsed.errors.len()
            );
        }
        for inst in &parsed.rows {
            let mirror = repos.join(mirror_name(&inst.repo));
            if !mirror.join("HEAD").is_file() {
                bail!(
                    "no mirror of {} in {} (for {}): unpack it with `reprobench datasets import TARBALL --repos {}`",
                    inst.repo,
                    repos.display(),
                    inst.instance_id,
                    repos.display()
                );
            }
            let commit = inst.base_commit.clone();
            cases.push(OracleCase::of(inst, |path| {
                reprobench_swt::mirror::file_at(&mirror, &commit, path)
            }));
        }
    }
    Ok(cases)
}

/// Runs the oracle until interrupted (Ctrl-C or SIGTERM).
pub async fn oracle(a: OracleArgs) -> Result<()> {
    if a.swt.is_empty() && a.android.is_empty() {
        bail!("the oracle knows nothing: give --swt ROWS (with --repos DIR) and/or --android DIR");
    }
    let cases = swt_cases(&a.swt, &a.repos)?;
    for case in &cases {
        for problem in case.problems() {
            eprintln!("oracle: {}: {problem}", case.instance_id);
        }
    }
    let swt = SwtOracle::new(cases);
    let mut android = Vec::new();
    for dir in &a.android {
        let dataset = reprobench_android::sim::Dataset::load(dir)
            .with_context(|| format!("cannot load the android-sim dataset {}", dir.display()))?;
        android.push(reprobench_android::oracle::AndroidOracle::new(&dataset));
    }
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let served = ScriptedUpstream::serve(listener, ORACLE, Keep::Count, move |request| {
        respond(&swt, &android, &request.body)
    });
    println!("{}", served.base_url());
    eprintln!(
        "oracle: serving at {} (an oracle answering from golden patches and ground truths, not a language model); Ctrl-C stops it",
        served.base_url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch SIGTERM")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("oracle: stopped after {} requests", served.request_count());
    Ok(())
}
