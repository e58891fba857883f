//! `reprobench review`: human verdicts for non-crash Android results (the LTGDroid protocol:
//! two independent reviewers, a third when they disagree). Reads and writes the coordinator's
//! store directly, like `results --data`, and writes only while no coordinator serves it.

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand, ValueEnum};
use reprobench_coordinator::review::{HumanVerdict, ReviewState, count};
use reprobench_coordinator::store::{ReviewItem, Store};
use std::path::{Path, PathBuf};

/// How the protocol works (the long help of `review`).
pub const PROTOCOL: &str = "Human verdicts for non-crash Android bugs, the LTGDroid paper's protocol.\n\n\
    A non-crash bug has no crash oracle: whether an agent's trace shows the reported symptom is \
    decided by people. The queue of a run is its android results with bug_type non-crash that \
    finished without an error (every agent; --agent narrows it). Each item is examined \
    independently by two reviewers (look at the trace and screenshots under its artifact path). \
    If the two agree, their verdict is final (`agreed`); if they disagree the item is a `tie` and \
    a third reviewer decides (`decided`). A reviewer reviews an item once: a second submit by \
    the same reviewer is refused (reviews are final), and a third review of an agreed item is \
    refused. The final verdict replaces `success` and `verdict` of the result row, so \
    `reprobench results RUN` shows the reviewed values; the automatic verdict is kept in the \
    store and shown by `review list` and `review status`.\n\n\
    Reviews are written to the store in DATA_DIR directly, while no coordinator serves it (the \
    coordinator is the store's only writer while it runs: stop it, review, start it again; its \
    runs resume). `list` and `status` also work while it runs.";

/// `reprobench review` arguments.
#[derive(Args)]
pub struct ReviewArgs {
    #[command(subcommand)]
    command: ReviewCommand,
    /// Data directory of the store (the coordinator's or the local cluster's).
    #[arg(long, value_name = "DIR", global = true, default_value = crate::DEFAULT_DATA)]
    data: PathBuf,
}

/// Which items `review list` shows.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StateFilter {
    /// Fewer than two reviews.
    Pending,
    /// The first two reviewers disagree: a third is needed.
    Tie,
    /// Two reviewers agree.
    Agreed,
    /// A third reviewer decided.
    Decided,
    /// Every item.
    All,
}

/// A verdict as typed on the command line.
#[derive(Clone, Copy, ValueEnum)]
enum VerdictArg {
    /// The trace shows the reported symptom.
    Reproduced,
    /// It does not.
    NotReproduced,
}

#[derive(Subcommand)]
enum ReviewCommand {
    /// The review queue of a run: each item with its automatic verdict, artifact path and state.
    List {
        /// Run id.
        run: String,
        /// Only items in this state.
        #[arg(long, value_enum, default_value = "all")]
        state: StateFilter,
        /// Only this agent's results.
        #[arg(long)]
        agent: Option<String>,
        /// Print JSON (one array of items).
        #[arg(long)]
        json: bool,
    },
    /// Give one reviewer's verdict on one item (chosen by --task, or by --instance and, when that
    /// matches several results, --agent/--variant/--backbone/--repeat).
    #[command(group = clap::ArgGroup::new("item").required(true).multiple(true).args(["task", "instance"]))]
    Submit {
        /// Run id.
        run: String,
        /// The result's task id (as `review list` shows it).
        #[arg(long, value_name = "ID")]
        task: Option<u64>,
        /// Instance id.
        #[arg(long, value_name = "ID")]
        instance: Option<String>,
        /// Agent, to pick one result of the instance.
        #[arg(long)]
        agent: Option<String>,
        /// Variant, to pick one result of the instance.
        #[arg(long)]
        variant: Option<String>,
        /// Backbone, to pick one result of the instance.
        #[arg(long)]
        backbone: Option<String>,
        /// Repeat index, to pick one result of the instance.
        #[arg(long)]
        repeat: Option<u32>,
        /// Who reviews (one review per reviewer and item).
        #[arg(long)]
        reviewer: String,
        /// The verdict.
        #[arg(long, value_enum)]
        verdict: VerdictArg,
        /// Free text kept with the review.
        #[arg(long)]
        note: Option<String>,
        /// Print the item as JSON after the review.
        #[arg(long)]
        json: bool,
    },
    /// Counts of items per state, and how many final verdicts differ from the automatic ones.
    Status {
        /// Run id.
        run: String,
        /// Only this agent's results.
        #[arg(long)]
        agent: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Opens the store to read a run's queue. When no coordinator holds the data directory, it is
/// opened for writing once so that a store made by an older build gains the review table.
fn open(data: &Path, run: &str) -> Result<Store> {
    let store = match reprobench_coordinator::server::lock_data_dir(data) {
        Ok(_lock) if data.join(reprobench_coordinator::store::DB_FILE).exists() => {
            drop(Store::open(data)?);
            Store::open_read_only(data)?
        }
        _ => Store::open_read_only(data)?,
    };
    crate::client::ensure_run(&store, run, data)?;
    Ok(store)
}

fn queue(store: &Store, run: &str, agent: Option<&str>) -> Result<Vec<ReviewItem>> {
    let mut items = store.review_queue(run, None)?;
    items.retain(|i| agent.is_none_or(|a| i.agent == a));
    Ok(items)
}

fn describe(i: &ReviewItem) -> String {
    format!(
        "task {} {} {}/{}/{} repeat {}",
        i.task_id, i.instance_id, i.agent, i.variant, i.backbone, i.repeat
    )
}

/// `reprobench review`.
pub fn review(a: ReviewArgs) -> Result<()> {
    match a.command {
        ReviewCommand::List {
            run,
            state,
            agent,
            json,
        } => {
            let store = open(&a.data, &run)?;
            let mut items = queue(&store, &run, agent.as_deref())?;
            items.retain(|i| match state {
                StateFilter::All => true,
                StateFilter::Pending => i.state == ReviewState::Pending,
                StateFilter::Tie => i.state == ReviewState::Tie,
                StateFilter::Agreed => i.state == ReviewState::Agreed,
                StateFilter::Decided => i.state == ReviewState::Decided,
            });
            if json {
                println!("{}", serde_json::to_string(&items)?);
                return Ok(());
            }
            if items.is_empty() {
                println!(
                    "no items: the queue holds android non-crash results that finished without an error"
                );
                return Ok(());
            }
            println!(
                "{:>6} {:<20} {:<24} {:>3} {:<15} {:<15} {:<8} reviews / artifacts",
                "task", "instance", "agent/variant/backbone", "rep", "automatic", "now", "state"
            );
            for i in &items {
                let reviews: Vec<String> = i
                    .reviews
                    .iter()
                    .map(|r| format!("{}={}", r.reviewer, r.verdict))
                    .collect();
                println!(
                    "{:>6} {:<20} {:<24} {:>3} {:<15} {:<15} {:<8} [{}] {}",
                    i.task_id,
                    i.instance_id,
                    format!("{}/{}/{}", i.agent, i.variant, i.backbone),
                    i.repeat,
                    i.auto_verdict,
                    i.verdict,
                    i.state.as_str(),
                    reviews.join(", "),
                    i.artifact_path
                );
            }
        }
        ReviewCommand::Status { run, agent, json } => {
            let store = open(&a.data, &run)?;
            let c = count(&queue(&store, &run, agent.as_deref())?);
            if json {
                println!("{}", serde_json::to_string(&c)?);
            } else {
                println!(
                    "run {run}: {} non-crash items: {} pending, {} tie, {} agreed, {} decided; {} verdicts changed by review ({} to reproduced, {} to not reproduced)",
                    c.items,
                    c.pending,
                    c.tie,
                    c.agreed,
                    c.decided,
                    c.changed,
                    c.changed_to_reproduced,
                    c.changed_to_not_reproduced
                );
            }
        }
        ReviewCommand::Submit {
            run,
            task,
            instance,
            agent,
            variant,
            backbone,
            repeat,
            reviewer,
            verdict,
            note,
            json,
        } => {
            let reviewer = reviewer.trim().to_string();
            if reviewer.is_empty() {
                bail!("--reviewer must name the reviewer");
            }
            let items = queue(&open(&a.data, &run)?, &run, None)?;
            let matching: Vec<&ReviewItem> = items
                .iter()
                .filter(|i| {
                    task.is_none_or(|t| i.task_id == t)
                        && instance.as_ref().is_none_or(|x| &i.instance_id == x)
                        && agent.as_ref().is_none_or(|x| &i.agent == x)
                        && variant.as_ref().is_none_or(|x| &i.variant == x)
                        && backbone.as_ref().is_none_or(|x| &i.backbone == x)
                        && repeat.is_none_or(|x| i.repeat == x)
                })
                .collect();
            let item = match matching.as_slice() {
                [one] => *one,
                [] => bail!(
                    "no item of run {run}'s review queue matches; the queue holds android non-crash results that finished without an error (`reprobench review list {run}` shows them)"
                ),
                many => bail!(
                    "{} items match; name one with --task ID, or narrow with --agent/--variant/--backbone/--repeat:\n  {}",
                    many.len(),
                    many.iter()
                        .map(|i| describe(i))
                        .collect::<Vec<_>>()
                        .join("\n  ")
                ),
            };
            // The coordinator is the store's only writer while it runs: hold its lock while writing.
            let _lock = reprobench_coordinator::server::lock_data_dir(&a.data).map_err(|_| {
                anyhow!(
                    "a coordinator (or a local run) is using {} and is the store's only writer while it runs; \
                     stop it, submit the review, and start it again (its runs resume). `review list` and `review status` work meanwhile",
                    a.data.display()
                )
            })?;
            let store = Store::open(&a.data)?;
            let verdict = match verdict {
                VerdictArg::Reproduced => HumanVerdict::Reproduced,
                VerdictArg::NotReproduced => HumanVerdict::NotReproduced,
            };
            let now = reprobench_domain::time::now_ms();
            let after = store
                .submit_review(&run, item.task_id, &reviewer, verdict, note.as_deref(), now)?
                .map_err(|refusal| anyhow!("{}: {refusal}", describe(item)))
                .context("review refused")?;
            if json {
                println!("{}", serde_json::to_string(&after)?);
                return Ok(());
            }
            let outcome = match (after.state, after.final_verdict) {
                (ReviewState::Pending, _) => "pending: one more reviewer needed".to_string(),
                (ReviewState::Tie, _) => {
                    "tie: the two reviewers disagree, a third reviewer decides".to_string()
                }
                (_, Some(v)) => format!(
                    "{}: final verdict {v} (automatic {}){}",
                    after.state.as_str(),
                    after.auto_verdict,
                    if after.changed() {
                        "; the result row now shows the reviewed verdict"
                    } else {
                        ""
                    }
                ),
                (s, None) => s.as_str().to_string(),
            };
            println!(
                "recorded {reviewer}'s verdict {verdict} on {}; {outcome}",
                describe(&after)
            );
        }
    }
    Ok(())
}
