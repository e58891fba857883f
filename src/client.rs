//! The user side of `RunService`: submit and watch runs with progress, status, cancel, results.

use crate::local::{LocalCluster, LocalNodes};
use crate::{CancelArgs, ResultsArgs, ResultsFormat, RunArgs, StatusArgs, Target};
use anyhow::{Context, Result, anyhow, bail};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use reprobench_coordinator::core::CoreConfig;
use reprobench_coordinator::store::Store;
use reprobench_domain::kind::SlotSpec;
use reprobench_domain::messages::{RunList, RunProgress, RunState, RunSummary};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::results::ResultRow;
use reprobench_proto::auth::{AuthedChannel, CoordinatorAddress, read_token};
use reprobench_proto::v1::run_service_client::RunServiceClient;
use reprobench_proto::v1::*;
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

type Client = RunServiceClient<AuthedChannel>;

async fn client(address: &CoordinatorAddress) -> Result<Client> {
    Ok(address.run_client().await?)
}

/// Resolves a client's target to a coordinator address (from --coordinator, or from --data's address file).
pub fn address_of(t: &Target) -> Result<CoordinatorAddress> {
    if let Some(url) = &t.coordinator {
        let token_file = t
            .token_file
            .as_ref()
            .ok_or_else(|| anyhow!("--coordinator needs --token-file"))?;
        return Ok(CoordinatorAddress {
            url: url.clone(),
            token: read_token(token_file)?,
            tls_ca: t.tls_ca.clone(),
            tls_server_name: t.tls_server_name.clone(),
        });
    }
    let data = data_dir(t);
    let url = reprobench_coordinator::served_url(&data).ok_or_else(|| {
        anyhow!(
            "no coordinator is serving {}; start one with `reprobench serve --data {}`, or pass --coordinator URL --token-file F",
            data.display(),
            data.display()
        )
    })?;
    let token_file = t
        .token_file
        .clone()
        .unwrap_or_else(|| data.join(reprobench_coordinator::server::TOKEN_FILE));
    Ok(CoordinatorAddress {
        url,
        token: read_token(&token_file)?,
        tls_ca: t.tls_ca.clone(),
        tls_server_name: t.tls_server_name.clone(),
    })
}

fn data_dir(t: &Target) -> PathBuf {
    t.data
        .clone()
        .unwrap_or_else(|| PathBuf::from(crate::DEFAULT_DATA))
}

/// Two slots of each executor kind in `kinds`.
fn two_slots_each(kinds: &std::collections::BTreeSet<ExecutorKind>) -> Vec<SlotSpec> {
    kinds
        .iter()
        .map(|&kind| SlotSpec { kind, slots: 2 })
        .collect()
}

/// What `--node-slots` leaves out of the executor kinds a sweep's tasks need (its tasks would
/// wait for a slot no local node offers), as an error that names the fix; `None` when nothing is
/// left out or no slots were given (then the needed ones are offered).
fn slots_left_out(needed: &[SlotSpec], given: &[SlotSpec]) -> Option<String> {
    if given.is_empty() {
        return None;
    }
    let missing: Vec<&str> = needed
        .iter()
        .map(|s| s.kind)
        .filter(|kind| !given.iter().any(|g| g.kind == *kind && g.slots > 0))
        .map(ExecutorKind::as_str)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let add: Vec<String> = missing
        .iter()
        .map(|k| format!("--node-slots {k}=2"))
        .collect();
    Some(format!(
        "the sweep's tasks need slots of kind {} and --node-slots offers none of them, so they would wait forever: add {} (or leave --node-slots out to get what the sweep needs); for SWT datasets the kind is the sweep's `[eval] executor` (when it names none: the kind --node-slots offers, else docker where the engine and base image are, else process)",
        missing.join(", "),
        add.join(" ")
    ))
}

/// Whether a sweep's TOML names its SWT executor (`[eval] executor`) itself.
fn names_executor(sweep_toml: &str) -> bool {
    sweep_toml
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("eval")?.as_table()?.get("executor").cloned())
        .is_some()
}

/// A sweep's TOML with `[eval] executor = kind` added.
fn with_executor(sweep_toml: &str, kind: ExecutorKind) -> Result<String> {
    let mut table: toml::Table = sweep_toml.parse()?;
    let eval = table
        .entry("eval")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let Some(eval) = eval.as_table_mut() else {
        bail!("`eval` must be a table ([eval])");
    };
    eval.insert("executor".into(), toml::Value::String(kind.to_string()));
    Ok(toml::to_string(&table)?)
}

/// `reprobench run`.
pub async fn run(a: RunArgs) -> Result<ExitCode> {
    let sweep = std::fs::read_to_string(&a.sweep)
        .with_context(|| format!("cannot read the sweep spec {}", a.sweep.display()))?;
    // `{sweep_dir}` (in an external agent's command, say) stands for the spec's own directory.
    let spec_dir = std::path::absolute(a.sweep.parent().unwrap_or(Path::new(".")))
        .unwrap_or_else(|_| PathBuf::from("."));
    let sweep = sweep.replace("{sweep_dir}", &spec_dir.display().to_string());
    // Check the spec here too, so a typo is reported before any cluster starts.
    let spec = reprobench_domain::sweep::SweepSpec::from_toml(&sweep)
        .with_context(|| format!("in {}", a.sweep.display()))?;
    let sweep_dir = a.sweep.parent().unwrap_or(Path::new("."));
    let (attachments, problems) = crate::datasets::attach(&spec, &a.datasets_dir(), sweep_dir)?;
    crate::datasets::print_row_errors(&problems);
    // The kinds the coordinator will give the tasks, decided by its own expansion rules.
    let mut kinds = reprobench_coordinator::sweep::task_kinds(&spec, &attachments)
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("in {}", a.sweep.display()))?;
    let mut req = SubmitRunRequest {
        sweep_toml: sweep,
        resume_existing: !a.new,
        attachments: attachments.into_iter().collect(),
        reuse_finished: false,
    };
    let mut spec = spec;
    let done = if let Some(n) = a.local_nodes {
        // Local nodes read this machine's mirrors: build them from shipped sources if missing.
        for name in &spec.datasets {
            if reprobench_domain::dataset_kind::classify(name, &a.datasets_dir(), sweep_dir)
                == reprobench_domain::dataset_kind::DatasetKind::Swt
            {
                let ds = crate::datasets::load(name, &a.datasets_dir(), sweep_dir, None)?;
                crate::datasets::ensure_mirrors(&ds, &a.node.settings().repos)?;
            }
        }
        if let Some(replay) = &a.node.replay {
            // The nodes load it too; checked here first so a bad source is one clear error.
            let index = reprobench_gateway::replay::ReplayIndex::load(replay)
                .map_err(|e| {
                    anyhow!(
                        "--replay {}: {}: {} (give a run's transcript .jsonl file or a directory holding them, such as the run's artifacts directory)",
                        replay.display(),
                        e.path.display(),
                        e.message
                    )
                })?;
            eprintln!(
                "REPLAY: {} recorded LLM calls from {}",
                index.len(),
                replay.display()
            );
            eprintln!(
                "REPLAY: LLM answers come from the transcripts in {}; no backbone is called",
                replay.display()
            );
        }
        // A sweep that does not name its SWT executor gets the one `eval` would choose: the kind
        // --node-slots offers, else docker where the engine and base image are, else process.
        if kinds.contains(&spec.eval.executor) && !names_executor(&req.sweep_toml) {
            let offered: Vec<ExecutorKind> = [ExecutorKind::Docker, ExecutorKind::Process]
                .into_iter()
                .filter(|k| a.node_slots.iter().any(|s| s.kind == *k && s.slots > 0))
                .collect();
            let chosen = match offered[..] {
                [one] => one,
                // Said even with --json (on stderr): the sweep runs on another executor than
                // its text shows.
                _ => crate::eval::auto_executor(&a.node, false).await,
            };
            if chosen != spec.eval.executor {
                req.sweep_toml = with_executor(&req.sweep_toml, chosen)
                    .with_context(|| format!("in {}", a.sweep.display()))?;
                kinds.remove(&spec.eval.executor);
                kinds.insert(chosen);
                spec.eval.executor = chosen;
            }
        }
        let needed = two_slots_each(&kinds);
        if let Some(problem) = slots_left_out(&needed, &a.node_slots) {
            bail!("{problem}");
        }
        if needed.iter().any(|s| s.kind == ExecutorKind::Docker)
            && let Some(why) = crate::eval::docker_unready(&a.node).await
        {
            bail!(
                "the sweep's SWT datasets run on the docker executor (its `[eval] executor`, or --node-slots docker=N), and the local nodes cannot run it: {why}; or run it on the process executor: `[eval] executor = \"process\"` in {}",
                a.sweep.display()
            );
        }
        let slots = if a.node_slots.is_empty() {
            needed
        } else {
            a.node_slots.clone()
        };
        let nodes = LocalNodes {
            count: n,
            slots,
            args: a.node.node_args(),
        };
        run_local(&data_dir(&a.target), &nodes, req, a.json).await?
    } else {
        let address = address_of(&a.target)?;
        if a.detach {
            let sub = client(&address)
                .await?
                .submit_run(req)
                .await
                .map_err(status_error)?
                .into_inner();
            if a.json {
                println!(
                    "{}",
                    serde_json::json!({ "run_id": sub.run_id, "tasks": sub.tasks, "resumed": sub.resumed })
                );
            } else {
                println!("{}", sub.run_id);
            }
            return Ok(ExitCode::SUCCESS);
        }
        match submit_and_wait(&address, req, a.json).await {
            Ok(d) => d,
            Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                eprintln!(
                    "\n{e}; the run goes on in the coordinator: `reprobench status` follows it"
                );
                return Ok(ExitCode::from(130));
            }
            Err(e) => return Err(e),
        }
    };
    report(&done, a.json);
    Ok(ExitCode::SUCCESS)
}

/// A finished (or cancelled) run and its results.
pub struct Finished {
    /// The run's totals.
    pub summary: RunSummary,
    /// Its result rows (with details).
    pub rows: Vec<ResultRow>,
    /// An earlier run of the same sweep was picked up.
    pub resumed: bool,
    /// Time this command waited.
    pub elapsed: Duration,
}

/// The user stopped waiting (Ctrl-C).
#[derive(Debug)]
pub struct Interrupted(pub String);

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interrupted: run {} is kept", self.0)
    }
}

impl std::error::Error for Interrupted {}

/// Submits a run, follows it with progress until it ends, and fetches its results.
pub async fn submit_and_wait(
    address: &CoordinatorAddress,
    req: SubmitRunRequest,
    quiet: bool,
) -> Result<Finished> {
    let sub = client(address)
        .await?
        .submit_run(req)
        .await
        .map_err(status_error)?
        .into_inner();
    note_submitted(&sub, quiet);
    let started = Instant::now();
    let summary = tokio::select! {
        s = watch(address, &sub.run_id, quiet) => s?,
        _ = tokio::signal::ctrl_c() => return Err(Interrupted(sub.run_id).into()),
    };
    let rows = fetch_results(address, &sub.run_id).await?;
    Ok(Finished {
        summary,
        rows,
        resumed: sub.resumed,
        elapsed: started.elapsed(),
    })
}

/// Runs a request on a fresh local cluster (embedded coordinator, node processes) and stops it after.
pub async fn run_local(
    data: &Path,
    nodes: &LocalNodes,
    req: SubmitRunRequest,
    quiet: bool,
) -> Result<Finished> {
    let mut cluster = LocalCluster::start(data, nodes, CoreConfig::default()).await?;
    let address = cluster.address.clone();
    let mut coordinator_failure = cluster.coordinator_failure();
    let coordinator_failed = async {
        match coordinator_failure.as_mut() {
            Some(f) => f.wait().await,
            None => std::future::pending().await,
        }
    };
    // A run on local nodes cannot end once every node has exited (a bad flag, an unreadable
    // replay source): say so instead of waiting forever.
    let nodes_gone = async {
        loop {
            if let Some(why) = cluster.all_nodes_exited() {
                return why;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    };
    let result = tokio::select! {
        r = submit_and_wait(&address, req, quiet) => r,
        why = nodes_gone => Err(anyhow!("{why}")),
        why = coordinator_failed => Err(anyhow!(
            "the embedded coordinator stopped because {why}; the run is kept as far as the store holds it: free the disk or fix {}, then run the same command again to resume it",
            data.display()
        )),
    };
    cluster.stop().await;
    result.map_err(|e| match e.downcast::<Interrupted>() {
        Ok(i) => anyhow!(
            "{i} in {}; run the same command again to resume it",
            data.display()
        ),
        Err(e) => e,
    })
}

fn note_submitted(sub: &SubmitRunResponse, json: bool) {
    if !json {
        let verb = if sub.resumed { "resuming" } else { "submitted" };
        eprintln!("{verb} run {} ({} tasks)", sub.run_id, sub.tasks);
    }
}

fn status_error(s: tonic::Status) -> anyhow::Error {
    if s.code() == tonic::Code::OutOfRange {
        // tonic's refusal of a message over the coordinator's limit.
        return anyhow!(
            "{}: the coordinator takes messages up to the size it was started with (`reprobench serve --max-message-mib`, {} by default); attach less per sweep (fewer or smaller datasets and predictions files), or restart the coordinator with a larger --max-message-mib",
            s.message(),
            reprobench_coordinator::server::MAX_MESSAGE_BYTES >> 20
        );
    }
    anyhow!("{}", s.message())
}

/// How long a run waits for a kind no connected node offers before its progress says so.
const UNSERVED_GRACE: Duration = Duration::from_secs(10);

/// Follows a run until it ends, drawing progress on stderr; reconnects if the coordinator restarts.
pub async fn watch(address: &CoordinatorAddress, run_id: &str, quiet: bool) -> Result<RunSummary> {
    let bars = MultiProgress::with_draw_target(if quiet {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    });
    let overall = bars.add(ProgressBar::new(0));
    overall.set_style(
        ProgressStyle::with_template("{prefix:>8} [{bar:32}] {pos}/{len} {msg} ETA {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    overall.set_prefix("tasks");
    let mut node_bars: HashMap<String, ProgressBar> = HashMap::new();
    let node_style = ProgressStyle::with_template("{prefix:>8} {msg}").expect("static template");
    let mut failures = 0u32;
    // Bars are not drawn into a file or a pipe (a run under nohup, CI): a line per finished task
    // is written there instead, with the same figures.
    let mut lines = (!quiet && !std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .then(|| ProgressLines::new(std::time::Instant::now()));
    let mut said_waiting: Option<String> = None;
    // Since when the run has waited for a kind no connected node offers.
    let mut unserved_since: Option<std::time::Instant> = None;
    loop {
        let stream = match client(address).await {
            Ok(mut c) => {
                c.watch_run(WatchRunRequest {
                    run_id: run_id.to_string(),
                })
                .await
            }
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        };
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(s)
                if s.code() == tonic::Code::NotFound
                    || s.code() == tonic::Code::Unauthenticated =>
            {
                bail!("{}", s.message())
            }
            Err(s) => {
                failures += 1;
                if failures > 120 {
                    bail!("lost the coordinator for good: {}", s.message());
                }
                overall.set_message(format!(
                    "(coordinator unreachable, retrying: {})",
                    s.message()
                ));
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        // The last progress, drawn again each second when none comes (the coordinator sends
        // only changes), so that a wait that lasts gets said.
        let mut last: Option<RunProgress> = None;
        loop {
            let next = match tokio::time::timeout(Duration::from_secs(1), stream.message()).await {
                Ok(next) => next.map(|p| p.map(RunProgress::from)),
                Err(_) => match &last {
                    Some(p) => Ok(Some(p.clone())),
                    None => continue,
                },
            };
            match next {
                Ok(Some(p)) => {
                    failures = 0;
                    last = Some(p.clone());
                    let s = p.run.clone();
                    let done = s.succeeded + s.failed + s.errored + s.cancelled;
                    overall.set_length(s.tasks);
                    overall.set_position(done);
                    let finished = s.succeeded + s.failed + s.errored;
                    let rate = if finished > 0 {
                        100.0 * s.succeeded as f64 / finished as f64
                    } else {
                        0.0
                    };
                    let unserved = unserved_note(&s);
                    if unserved.is_none() {
                        unserved_since = None;
                    }
                    let since = *unserved_since.get_or_insert_with(std::time::Instant::now);
                    // Said only once it lasts: nodes starting beside the run (`--local-nodes`)
                    // or reconnecting take a few seconds to offer their slots.
                    let waiting = unserved.filter(|_| since.elapsed() >= UNSERVED_GRACE);
                    overall.set_message(format!(
                        "ok {} fail {} err {} | success {rate:.1}% | running {}{}",
                        s.succeeded,
                        s.failed,
                        s.errored,
                        s.running,
                        waiting
                            .as_deref()
                            .map(|w| format!(" | {w}"))
                            .unwrap_or_default()
                    ));
                    if let Some(l) = lines.as_mut() {
                        if let Some(line) = l.line(done, s.tasks, &overall.message()) {
                            eprintln!("{line}");
                        }
                        // A run that waits for a kind of node says so once, even though no
                        // task finishes (no progress line would be written).
                        if waiting != said_waiting {
                            if let Some(w) = &waiting {
                                eprintln!("{w}");
                            }
                            said_waiting = waiting;
                        }
                    }
                    for n in &p.nodes {
                        let bar = node_bars.entry(n.node_id.clone()).or_insert_with(|| {
                            let b = bars.add(ProgressBar::new_spinner());
                            b.set_style(node_style.clone());
                            b.set_prefix("node");
                            b
                        });
                        let state = if n.live { "live" } else { "gone" };
                        bar.set_message(format!(
                            "{} [{state}] running {}/{} · delivered {}",
                            n.node_id, n.running, n.slots, n.finished
                        ));
                    }
                    if s.state != RunState::Running {
                        overall.finish();
                        for b in node_bars.values() {
                            b.finish();
                        }
                        return Ok(s);
                    }
                }
                Ok(None) => {
                    // The coordinator closes the stream when the run ends; confirm by listing.
                    if let Some(s) = find_run(address, run_id).await.ok().flatten()
                        && s.state != RunState::Running
                    {
                        overall.finish();
                        return Ok(s);
                    }
                    break;
                }
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a run's pending tasks wait for, when no connected node offers their executor kind.
pub fn unserved_note(s: &RunSummary) -> Option<String> {
    if s.unserved_kinds.is_empty() || s.pending == 0 {
        return None;
    }
    let kinds = s
        .unserved_kinds
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let example = &s.unserved_kinds[0];
    Some(format!(
        "waiting: pending tasks need {kinds} slots and no connected node offers them; start a node with `--slots {example}=N` (with `run --local-nodes`, `--node-slots {example}=N`), or let a scaler start one"
    ))
}

/// Progress as plain lines, one each time the count of finished tasks changes.
struct ProgressLines {
    started: std::time::Instant,
    /// Finished tasks at the first report (a resumed run's, not counted in the rate).
    first: Option<u64>,
    last: Option<u64>,
}

impl ProgressLines {
    fn new(started: std::time::Instant) -> ProgressLines {
        ProgressLines {
            started,
            first: None,
            last: None,
        }
    }

    /// `tasks 5/38 ok 5 ... ETA 31m` when `done` changed since the last line.
    fn line(&mut self, done: u64, total: u64, figures: &str) -> Option<String> {
        if self.last == Some(done) {
            return None;
        }
        self.last = Some(done);
        let first = *self.first.get_or_insert(done);
        let elapsed = self.started.elapsed().as_secs_f64();
        let eta = match done.checked_sub(first) {
            Some(n) if n > 0 && total > done => {
                format_minutes(elapsed / n as f64 * (total - done) as f64)
            }
            _ => "?".to_string(),
        };
        Some(format!(
            "tasks {done}/{total} {figures} | {} elapsed, ETA {eta}",
            format_minutes(elapsed)
        ))
    }
}

/// `42s`, `17m`, `2h05m`.
fn format_minutes(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

async fn find_run(address: &CoordinatorAddress, run_id: &str) -> Result<Option<RunSummary>> {
    let runs = client(address)
        .await?
        .list_runs(ListRunsRequest {})
        .await?
        .into_inner()
        .runs;
    Ok(runs
        .into_iter()
        .map(RunSummary::from)
        .find(|r| r.run_id == run_id))
}

async fn fetch_results(address: &CoordinatorAddress, run_id: &str) -> Result<Vec<ResultRow>> {
    let mut stream = client(address)
        .await?
        .export_results(ExportResultsRequest {
            run_id: run_id.to_string(),
        })
        .await
        .map_err(status_error)?
        .into_inner();
    let mut rows = Vec::new();
    while let Some(r) = stream.message().await.map_err(status_error)? {
        rows.push(ResultRow::from(r));
    }
    Ok(rows)
}

/// A finished run as one JSON object (what `--json` prints).
pub fn finished_json(done: &Finished) -> serde_json::Value {
    let (s, rows, elapsed, resumed) = (&done.summary, &done.rows, done.elapsed, done.resumed);
    serde_json::json!({
        "run_id": s.run_id,
        "sweep": s.name,
        "state": s.state.as_str(),
        "tasks": s.tasks,
        "succeeded": s.succeeded,
        "failed": s.failed,
        "errored": s.errored,
        "cancelled": s.cancelled,
        "retried_attempts": s.retried_attempts,
        "result_rows": rows.len(),
        "resumed": resumed,
        "wall_s": elapsed.as_secs_f64(),
    })
}

/// Prints a finished run: its JSON summary, or a line and the summary table.
pub fn report(done: &Finished, json: bool) {
    let (s, rows, elapsed) = (&done.summary, &done.rows, done.elapsed);
    if json {
        println!("{}", finished_json(done));
        return;
    }
    println!(
        "run {} {}: {} tasks, {} succeeded, {} failed, {} errored, {} cancelled ({} attempts retried) in {:.1}s",
        s.run_id,
        s.state.as_str(),
        s.tasks,
        s.succeeded,
        s.failed,
        s.errored,
        s.cancelled,
        s.retried_attempts,
        elapsed.as_secs_f64()
    );
    if rows.iter().any(|r| r.track == "synthetic") {
        println!(
            "(synthetic tasks: simulated work for exercising the cluster; no agent or model ran)"
        );
    }
    println!();
    print!(
        "{}",
        reprobench_analysis::render_summary(&reprobench_analysis::summarize(rows))
    );
}

/// `reprobench status`.
pub async fn status(a: StatusArgs) -> Result<()> {
    let summaries = if a.target.coordinator.is_some() {
        let address = address_of(&a.target)?;
        let list = client(&address)
            .await?
            .list_runs(ListRunsRequest {})
            .await
            .map_err(status_error)?
            .into_inner();
        RunList::from(list).runs
    } else {
        let store = Store::open_read_only(&data_dir(&a.target))?;
        store.run_summaries()?
    };
    let selected: Vec<&RunSummary> = match &a.run {
        Some(id) => {
            let s = summaries.iter().find(|s| &s.run_id == id).ok_or_else(|| {
                anyhow!("no run `{id}`; `reprobench status` without a run id lists them")
            })?;
            vec![s]
        }
        None => summaries.iter().collect(),
    };
    let attempts = if a.attempts {
        let run = a.run.as_deref().expect("clap requires RUN with --attempts");
        if a.target.coordinator.is_some() {
            bail!("--attempts reads the store: pass --data DIR on the coordinator's machine");
        }
        Some(Store::open_read_only(&data_dir(&a.target))?.attempts(run)?)
    } else {
        None
    };
    if a.json {
        let runs: Vec<serde_json::Value> = selected.iter().map(|s| summary_json(s)).collect();
        let mut v = if a.run.is_some() {
            runs[0].clone()
        } else {
            serde_json::json!({ "runs": runs })
        };
        if let Some(att) = attempts {
            v["attempts"] = serde_json::to_value(att)?;
        }
        println!("{v}");
        return Ok(());
    }
    if selected.is_empty() {
        println!(
            "no runs yet; start one with `reprobench run SWEEP.toml --local-nodes 2` or `reprobench quickstart`"
        );
    }
    for s in &selected {
        println!(
            "{}  {:<9} {:<20} tasks {:>6}  pending {:>6}  running {:>4}  ok {:>6}  fail {:>6}  err {:>4}  cancelled {:>5}  retried {:>4}",
            s.run_id,
            s.state.as_str(),
            s.name,
            s.tasks,
            s.pending,
            s.running,
            s.succeeded,
            s.failed,
            s.errored,
            s.cancelled,
            s.retried_attempts
        );
        if let Some(w) = unserved_note(s) {
            println!("    {w}");
        }
    }
    if let Some(att) = attempts {
        println!(
            "\n{:>8} {:<18} {:>5} {:<22} {:<14} reason",
            "task", "instance", "epoch", "node", "status"
        );
        for r in att {
            let late = if r.late_result_rejected_at_ms.is_some() {
                " (late result rejected)"
            } else {
                ""
            };
            println!(
                "{:>8} {:<18} {:>5} {:<22} {:<14} {}{late}",
                r.task_id,
                r.instance_id,
                r.epoch,
                r.node_id,
                r.status,
                r.reason.unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn summary_json(s: &RunSummary) -> serde_json::Value {
    serde_json::json!({
        "run_id": s.run_id, "sweep": s.name, "state": s.state.as_str(), "tasks": s.tasks, "pending": s.pending,
        "running": s.running, "succeeded": s.succeeded, "failed": s.failed, "errored": s.errored,
        "cancelled": s.cancelled, "retried_attempts": s.retried_attempts,
        "created_at_ms": s.created_at_ms, "finished_at_ms": s.finished_at_ms,
        "unserved_kinds": s.unserved_kinds,
    })
}

/// `reprobench cancel`.
pub async fn cancel(a: CancelArgs) -> Result<()> {
    let address = address_of(&a.target)?;
    let n = client(&address)
        .await?
        .cancel_run(CancelRunRequest {
            run_id: a.run.clone(),
        })
        .await
        .map_err(status_error)?
        .into_inner()
        .cancelled_tasks;
    println!("cancelled run {} ({n} unfinished tasks withdrawn)", a.run);
    Ok(())
}

/// Fails with an error that says how to list the runs when `store` (the data directory `data`)
/// has no run `run`.
pub fn ensure_run(store: &Store, run: &str, data: &Path) -> Result<()> {
    if store.sweep_toml(run)?.is_none() {
        bail!(
            "no run `{run}` in {}; `reprobench status --data {}` lists the runs",
            data.display(),
            data.display()
        );
    }
    Ok(())
}

/// `reprobench results`.
pub async fn results(a: ResultsArgs) -> Result<()> {
    let rows = if a.target.coordinator.is_some() {
        fetch_results(&address_of(&a.target)?, &a.run).await?
    } else {
        let store = Store::open_read_only(&data_dir(&a.target))?;
        ensure_run(&store, &a.run, &data_dir(&a.target))?;
        store.results(&a.run)?
    };
    let mut out: Box<dyn Write> = match &a.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    match a.format {
        ResultsFormat::Jsonl => {
            for r in &rows {
                serde_json::to_writer(&mut out, r)?;
                out.write_all(b"\n")?;
            }
        }
        ResultsFormat::Parquet => {
            if a.out.is_none() {
                bail!("--format parquet writes a binary file: pass --out FILE.parquet");
            }
            reprobench_analysis::frame::write_parquet(&rows, &mut out)?;
        }
        ResultsFormat::Csv => {
            let mut w = csv::Writer::from_writer(&mut out);
            for r in &rows {
                w.serialize(r)?;
            }
            if rows.is_empty() {
                w.write_record(reprobench_analysis::frame::COLUMNS)?;
            }
            w.flush()?;
        }
    }
    out.flush()?;
    if let Some(path) = &a.out {
        eprintln!("wrote {} result rows to {}", rows.len(), path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use reprobench_analysis::frame::COLUMNS as RESULT_COLUMNS;
    use reprobench_domain::results::ResultRow;

    #[test]
    fn node_slots_that_leave_out_a_needed_kind_are_refused_naming_the_flag_to_add() {
        use reprobench_domain::kind::SlotSpec;
        let slot = |kind: &str, slots| SlotSpec {
            kind: reprobench_domain::registry::ExecutorKind::parse(kind).unwrap(),
            slots,
        };
        let needed = [slot("docker", 2), slot("sim", 2)];
        assert_eq!(super::slots_left_out(&needed, &[]), None);
        assert_eq!(
            super::slots_left_out(&needed, &[slot("docker", 1), slot("sim", 4)]),
            None
        );
        let problem = super::slots_left_out(&needed, &[slot("process", 1), slot("sim", 0)])
            .expect("docker and sim are left out");
        assert!(
            problem.contains("--node-slots docker=2 --node-slots sim=2"),
            "{problem}"
        );
    }

    #[test]
    fn csv_header_is_the_results_schema_in_order() {
        let row = ResultRow::default();
        let mut w = csv::Writer::from_writer(Vec::new());
        w.serialize(&row).unwrap();
        let text = String::from_utf8(w.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), RESULT_COLUMNS.join(","));
    }

    #[test]
    fn progress_lines_come_when_the_count_changes_with_an_eta_from_this_session() {
        let started = std::time::Instant::now() - std::time::Duration::from_secs(600);
        let mut l = super::ProgressLines::new(started);
        // A resumed run: 10 tasks were finished before this session.
        let first = l.line(10, 30, "ok 10").unwrap();
        assert!(first.starts_with("tasks 10/30 ok 10 |"), "{first}");
        assert!(first.ends_with("ETA ?"), "{first}");
        assert_eq!(l.line(10, 30, "ok 10"), None);
        // 5 in 10 minutes: the last 15 take 30 more.
        let next = l.line(15, 30, "ok 15").unwrap();
        assert!(next.contains("10m elapsed"), "{next}");
        assert!(next.ends_with("ETA 30m"), "{next}");
        assert_eq!(super::format_minutes(7500.0), "2h05m");
        assert_eq!(super::format_minutes(42.0), "42s");
    }
}
