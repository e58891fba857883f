//! `ltgdroid`: LLM-guided bug reproduction by bounded breadth-first exploration with
//! pre-assessment of UI actions (the LTGDroid paper), with its ablations.
//!
//! Per level: for each kept path, the Path Explorer enumerates the screen's actions, the LLM
//! keeps the top k = 6, and each kept action is executed from the path's snapshot and rolled
//! back, with an LLM summary of the transition from the before/after screenshots and activities.
//! The Path Evaluator keeps the top m = 3 extended paths and may name one complete; the Bug
//! Verifier confirms it (crash: the crash oracle; non-crash: an LLM check of the final
//! screenshot). The run stops on a confirmed path, an exhausted budget, or no path left.
//!
//! A crash ends its path, and the path is a reproduction candidate whatever the evaluator says,
//! as in LTGDroid's public code (`explore.py`: right after an action, a `FATAL EXCEPTION` in
//! logcat ends the exploration with that path). Unlike that code, which accepts any crash, the
//! crash oracle confirms it only when it is the reported one ([`Crash::is_reported`] against
//! the exceptions the report names; `no-bv` takes it as it is); a crash on a non-crash report,
//! or another crash, only ends its path. The crashed paths of a level are checked, in job order,
//! once the level's candidates are assessed (they run at once on K replicas), before the
//! evaluator is asked; a crash on the budget's last action still counts.
//!
//! Screens are not merged: every action leads to a new state, as the paper says (§II-A: "we
//! treat each action as leading to a new UI state regardless of whether the underlying view
//! hierarchy changes"), and as the public code does (`frame/scene.py` appends a random
//! 4-digit suffix to each captured screen's structural hash, so its "scene already explored"
//! branch practically never runs). Loops and paths that do the same are left to the Path
//! Evaluator, whose prompt says to drop them, as the public code's does.
//!
//! Faster than the original: the candidates of every kept path at a level go into one queue
//! served by K device replicas that restore snapshots from one shared store, so K actions (and
//! their summaries) are pre-assessed at once. The order of results does not depend on K.

pub mod bench;
pub mod guided;
pub mod prompts;

use super::agent::{
    AgentError, AndroidRun, Exhausted, Meter, ask, describe_action, describe_widget, report_text,
    widget_lines,
};
use super::device::{
    Action, Crash, Device, DeviceError, Direction, Hierarchy, Key, Widget, WidgetRef,
    reported_exceptions,
};
use super::explore::{ActionRules, enumerate_with};
use prompts::{PathStep, ScreenText};
use reprobench_domain::android::{AndroidReport, BugType};
use reprobench_gateway::llm::{Llm, LlmError};
use serde_json::{Value, json};
use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Candidate actions the filter keeps per screen (LTGDroid's `llm_first_branch_limit`).
pub const FIRST_BRANCH_LIMIT: usize = 6;
/// Paths the evaluator keeps per level (LTGDroid's `llm_second_branch_limit`).
pub const SECOND_BRANCH_LIMIT: usize = 3;
/// The variants: the full system and one ablation per module.
pub const VARIANTS: &[&str] = &["full", "no-ra", "no-ae", "no-ta", "no-bv"];

/// Which modules run (the paper's ablations switch one off each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// Report Analyzer (`no-ra`: the raw report is the objective).
    pub report_analyzer: bool,
    /// UI action enumeration and pre-assessment (`no-ae`: the LLM chooses one action per step).
    pub action_enumeration: bool,
    /// LLM transition summaries (`no-ta`: paths carry actions only).
    pub transition_assessment: bool,
    /// Bug verification of a path the evaluator calls complete (`no-bv`: taken as is).
    pub bug_verification: bool,
}

impl Variant {
    /// The variant named `name` (one of [`VARIANTS`]).
    pub fn parse(name: &str) -> Option<Variant> {
        let full = Variant {
            report_analyzer: true,
            action_enumeration: true,
            transition_assessment: true,
            bug_verification: true,
        };
        Some(match name {
            "full" => full,
            "no-ra" => Variant {
                report_analyzer: false,
                ..full
            },
            "no-ae" => Variant {
                action_enumeration: false,
                ..full
            },
            "no-ta" => Variant {
                transition_assessment: false,
                ..full
            },
            "no-bv" => Variant {
                bug_verification: false,
                ..full
            },
            _ => return None,
        })
    }
}

/// How a run explores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Modules switched on.
    pub variant: Variant,
    /// Candidates kept per screen (k).
    pub first_branch_limit: usize,
    /// Paths kept per level (m).
    pub second_branch_limit: usize,
    /// Crash or non-crash (chooses the verifier).
    pub bug_type: BugType,
}

impl Config {
    /// The paper's settings for `variant` and `bug_type`.
    pub fn paper(variant: Variant, bug_type: BugType) -> Config {
        Config {
            variant,
            first_branch_limit: FIRST_BRANCH_LIMIT,
            second_branch_limit: SECOND_BRANCH_LIMIT,
            bug_type,
        }
    }
}

/// All four swipe directions.
const ALL_DIRECTIONS: &[Direction] = &[
    Direction::Up,
    Direction::Down,
    Direction::Left,
    Direction::Right,
];

/// LTGDroid's enumeration: text fields get input (and a click when clickable), widgets click
/// and long-click as they allow, scrollable widgets swipe in four directions; then the keys
/// Back, Enter, Delete and Home, screen-wide swipes in four directions, and rotation.
///
/// The paper (§IV-B) names its action categories as Click, LongClick, Swipe, InputText, Rotate
/// and "system-level key events (Press; e.g., Back, Enter, Delete, Home)", and defines an
/// action's target as possibly null, "such as in a global Swipe action" (§II); its public code
/// offers exactly those four keys and screen-wide swipes up, down, left and right on every
/// screen.
pub const LTGDROID_RULES: ActionRules = ActionRules {
    click_text_fields: true,
    swipes: ALL_DIRECTIONS,
    keys: &[Key::Back, Key::Enter, Key::Delete, Key::Home],
    screen_swipes: ALL_DIRECTIONS,
    rotate: true,
};

/// Every action LTGDroid considers on a screen (see [`LTGDROID_RULES`]).
pub fn candidate_actions(h: &Hierarchy) -> Vec<Action> {
    enumerate_with(h, &LTGDROID_RULES)
}

/// Whether a path that ended in `crash` reproduces the report: on a crash report, when the
/// crash is one the report names (`reported`; any crash when it names none), or as it is
/// without bug verification (`no-bv`); on a non-crash report, never.
fn crash_reproduces(cfg: &Config, crash: &Crash, reported: &BTreeSet<String>) -> bool {
    match cfg.bug_type {
        BugType::Crash => !cfg.variant.bug_verification || crash.is_reported(reported),
        BugType::NonCrash => false,
    }
}

/// A screen as captured after an action.
#[derive(Debug, Clone)]
struct Screen {
    activity: String,
    hierarchy: Hierarchy,
    png: Vec<u8>,
    crash: Option<Crash>,
}

impl Screen {
    fn text(&self) -> ScreenText {
        ScreenText {
            activity: self.activity.clone(),
            widgets: widget_lines(&self.hierarchy),
        }
    }
}

/// A node of the exploration: a path from app start and the state it reached.
#[derive(Debug, Clone)]
struct PathNode {
    actions: Vec<Action>,
    steps: Vec<PathStep>,
    /// Snapshot of the reached state; `None` when it cannot be expanded (the app crashed).
    snapshot: Option<String>,
    screen: std::sync::Arc<Screen>,
}

/// One pre-assessment job: an action from a kept path.
struct Job {
    parent: usize,
    action: Action,
}

async fn capture(dev: &dyn Device) -> Result<Screen, DeviceError> {
    Ok(Screen {
        activity: dev.current_activity().await?,
        hierarchy: dev.hierarchy().await?,
        png: dev.screenshot().await?,
        crash: dev.crash().await?,
    })
}

/// What stops a stage: a budget (ends the run with what it has) or an error.
enum Stop {
    Budget(Exhausted),
    Error(AgentError),
}

impl From<DeviceError> for Stop {
    fn from(e: DeviceError) -> Stop {
        Stop::Error(AgentError::Device(e))
    }
}

impl From<LlmError> for Stop {
    fn from(e: LlmError) -> Stop {
        match e {
            LlmError::Budget(_) => Stop::Budget(Exhausted::Llm),
            LlmError::Failed(m) => Stop::Error(AgentError::Llm(m)),
            LlmError::ContextLength(m) => Stop::Error(AgentError::ContextLength(m)),
        }
    }
}

/// The shared state of one run.
struct Explorer<'a, L> {
    llm: &'a L,
    devices: &'a [&'a dyn Device],
    cfg: Config,
    meter: &'a Meter,
    objective: String,
    /// The exceptions the report names (the crash oracle's reference).
    reported: BTreeSet<String>,
    snapshots: AtomicUsize,
    log: Mutex<Vec<Value>>,
}

impl<L: Llm + Clone + Sync> Explorer<'_, L> {
    fn note(&self, v: Value) {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(v);
    }

    fn next_snapshot(&self) -> String {
        format!("ltg-{}", self.snapshots.fetch_add(1, Ordering::SeqCst))
    }

    /// Candidates of one path: enumerated and filtered to k, with text for inputs.
    async fn explore_candidates(&self, node: &PathNode) -> Result<Vec<Action>, Stop> {
        let mut llm = self.llm.clone();
        let all = candidate_actions(&node.screen.hierarchy);
        let words: Vec<String> = all.iter().map(describe_action).collect();
        let k = self.cfg.first_branch_limit;
        let (sys, user) =
            prompts::filter(&self.objective, &node.steps, &node.screen.text(), &words, k);
        let answer = ask(&mut llm, &sys, &user, &[&node.screen.png]).await?;
        let mut kept = prompts::kept_indices(&answer, all.len(), k, "keep");
        let readable = !kept.is_empty();
        if kept.is_empty() {
            // An unreadable or empty answer keeps the first k, so the path is not lost.
            kept = (0..all.len().min(k)).collect();
        }
        self.note(json!({"stage": "filter", "path_len": node.actions.len(),
            "candidates": all.len(), "kept": kept, "readable": readable}));
        // Text for the kept input actions, asked for all at once.
        let actions = kept.into_iter().map(|i| {
            let mut action = all[i].clone();
            let mut llm = self.llm.clone();
            async move {
                if let Action::InputText { target, text } = &mut action {
                    let (sys, user) =
                        prompts::input(&self.objective, &node.steps, &describe_widget(target));
                    let answer = ask(&mut llm, &sys, &user, &[]).await?;
                    if let Some(t) = prompts::input_text_of(&answer) {
                        *text = t;
                    }
                }
                Ok::<Action, Stop>(action)
            }
        });
        futures_util::future::join_all(actions)
            .await
            .into_iter()
            .collect()
    }

    /// `no-ae`: the one action the LLM chooses from the widget list, if it names a valid one.
    async fn choose_action(&self, node: &PathNode) -> Result<Option<Action>, Stop> {
        let mut llm = self.llm.clone();
        let listed: Vec<&Widget> = node
            .screen
            .hierarchy
            .widgets()
            .into_iter()
            .filter(|w| w.enabled)
            .collect();
        let screen = ScreenText {
            activity: node.screen.activity.clone(),
            widgets: listed
                .iter()
                .map(|w| describe_widget(&WidgetRef::of(w)))
                .collect(),
        };
        let (sys, user) = prompts::choose(&self.objective, &node.steps, &screen);
        let answer = ask(&mut llm, &sys, &user, &[&node.screen.png]).await?;
        let choice = prompts::choice_of(&answer);
        let target = |c: &prompts::Choice| {
            c.widget
                .and_then(|i| listed.get(i))
                .map(|w| WidgetRef::of(w))
        };
        let action = choice.as_ref().and_then(|c| {
            let swipe = |direction| Action::Swipe {
                direction,
                target: target(c),
            };
            Some(match c.action.as_str() {
                "click" => Action::Click { target: target(c)? },
                "long_click" | "long-click" => Action::LongClick { target: target(c)? },
                "input" | "input_text" => Action::InputText {
                    target: target(c)?,
                    text: c.text.clone().unwrap_or_default(),
                },
                "swipe_up" => swipe(Direction::Up),
                "swipe_down" => swipe(Direction::Down),
                "swipe_left" => swipe(Direction::Left),
                "swipe_right" => swipe(Direction::Right),
                "back" => Action::Press { key: Key::Back },
                "enter" => Action::Press { key: Key::Enter },
                "delete" => Action::Press { key: Key::Delete },
                "home" => Action::Press { key: Key::Home },
                "rotate" => Action::Rotate,
                _ => return None,
            })
        });
        self.note(json!({"stage": "choose", "path_len": node.actions.len(),
            "action": action.as_ref().map(describe_action)}));
        Ok(action)
    }

    /// Executes each job from its parent's snapshot on the first free replica. Each job's
    /// result is sent on `done` (in any order, with its index) as soon as its transition is
    /// summarized, while its snapshot is still being saved; the future ends when every job, saves
    /// included, is done, with the first stop (budget or error) if any.
    async fn preassess(
        &self,
        nodes: &[PathNode],
        jobs: Vec<Job>,
        done: tokio::sync::mpsc::UnboundedSender<(usize, Option<PathNode>)>,
    ) -> Option<Stop> {
        let queue = Mutex::new(jobs.into_iter().enumerate().collect::<VecDeque<_>>());
        let stop: Mutex<Option<Stop>> = Mutex::new(None);
        let workers = self.devices.iter().map(|dev| {
            let (queue, stop, done) = (&queue, &stop, done.clone());
            async move {
                let mut llm = self.llm.clone();
                loop {
                    if stop.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                        return;
                    }
                    let Some((i, job)) =
                        queue.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
                    else {
                        return;
                    };
                    let parent = &nodes[job.parent];
                    let report = |child| {
                        let _ = done.send((i, child));
                    };
                    if let Err(s) = self
                        .assess_one(*dev, &mut llm, parent, job.action, report)
                        .await
                    {
                        stop.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(s);
                        return;
                    }
                }
            }
        });
        let workers: Vec<_> = workers.collect();
        // Only the workers hold senders now: the channel closes when the last one ends.
        drop(done);
        futures_util::future::join_all(workers).await;
        stop.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    /// Restores `parent`'s state on `dev`, performs `action`, captures the result and reports
    /// the new path (`None` when the action could not be done) once its transition is assessed;
    /// the snapshot of the new state (unless the app crashed) is saved meanwhile, and is complete
    /// when this returns.
    async fn assess_one(
        &self,
        dev: &dyn Device,
        llm: &mut L,
        parent: &PathNode,
        action: Action,
        report: impl FnOnce(Option<PathNode>),
    ) -> Result<(), Stop> {
        let Some(snapshot) = &parent.snapshot else {
            report(None);
            return Ok(());
        };
        self.meter.check_time().map_err(Stop::Budget)?;
        dev.load_snapshot(snapshot).await?;
        self.meter.take_action().map_err(Stop::Budget)?;
        let words = describe_action(&action);
        match dev.act(&action).await {
            Ok(()) => {}
            Err(DeviceError::Rejected(why)) => {
                self.note(json!({"stage": "execute", "action": words, "rejected": why}));
                report(None);
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        let after = capture(dev).await?;
        let crash_note = after.crash.as_ref().map(|c| {
            format!(
                "the app has stopped ({}: {})",
                c.exception,
                c.message.lines().next().unwrap_or_default()
            )
        });
        let name = after.crash.is_none().then(|| self.next_snapshot());
        // The snapshot is saved while the LLM summarizes the transition (the summary needs only
        // the screenshots already taken), and the path is reported as soon as it is summarized.
        let save = async {
            if let Some(n) = &name {
                dev.save_snapshot(n).await?;
            }
            Ok::<(), Stop>(())
        };
        let summarize = async {
            let effect = if self.cfg.variant.transition_assessment {
                let (sys, user) = prompts::summarize(
                    &words,
                    &parent.screen.activity,
                    &after.activity,
                    crash_note.as_deref(),
                );
                let answer = ask(llm, &sys, &user, &[&parent.screen.png, &after.png]).await?;
                Some(prompts::summary_of(&answer))
            } else {
                // Without transition assessment only the crash oracle's finding is recorded.
                crash_note.clone().map(|c| format!("[{c}]"))
            };
            let mut child = parent.clone();
            child.actions.push(action);
            child.steps.push(PathStep {
                action: words.clone(),
                effect,
            });
            child.snapshot = name.clone();
            child.screen = std::sync::Arc::new(after.clone());
            report(Some(child));
            Ok::<(), Stop>(())
        };
        let (saved, summarized) = tokio::join!(save, summarize);
        saved.and(summarized)
    }

    /// The Bug Verifier on a path the evaluator called complete.
    async fn verify(&self, node: &PathNode) -> Result<bool, Stop> {
        if !self.cfg.variant.bug_verification {
            return Ok(true);
        }
        let ok = match self.cfg.bug_type {
            BugType::Crash => node
                .screen
                .crash
                .as_ref()
                .is_some_and(|c| c.is_reported(&self.reported)),
            BugType::NonCrash => {
                let mut llm = self.llm.clone();
                let (sys, user) =
                    prompts::verify(&self.objective, &node.steps, &node.screen.activity);
                let answer = ask(&mut llm, &sys, &user, &[&node.screen.png]).await?;
                prompts::verdict_of(&answer).unwrap_or(false)
            }
        };
        self.note(json!({"stage": "verify", "path_len": node.actions.len(), "confirmed": ok}));
        Ok(ok)
    }

    /// The pre-assessment jobs of the kept paths: each path's candidates (filter calls at once).
    async fn jobs_for(&self, frontier: &[PathNode]) -> Result<Vec<Job>, Stop> {
        let per_path = futures_util::future::join_all(frontier.iter().map(|node| async {
            if self.cfg.variant.action_enumeration {
                self.explore_candidates(node).await
            } else {
                match self.choose_action(node).await? {
                    Some(action) => Ok(vec![action]),
                    // An unreadable choice falls back as `full`'s unreadable filter does (the
                    // first k candidates), so the ablation is not lowered by a parse failure.
                    None => {
                        let k = self.cfg.first_branch_limit;
                        let fallback: Vec<Action> = candidate_actions(&node.screen.hierarchy)
                            .into_iter()
                            .take(k)
                            .collect();
                        self.note(json!({"stage": "choose_fallback",
                            "path_len": node.actions.len(), "kept": fallback.len()}));
                        Ok(fallback)
                    }
                }
            }
        }))
        .await;
        let mut jobs = Vec::new();
        for (parent, r) in per_path.into_iter().enumerate() {
            jobs.extend(r?.into_iter().map(|action| Job { parent, action }));
        }
        Ok(jobs)
    }

    /// Decides on one level's new paths: a crashed path that reproduces the report, or a
    /// verified path the evaluator calls complete, ends the run; otherwise the kept paths and
    /// the jobs of the next level.
    async fn decide(&self, level: usize, children: Vec<PathNode>, run: &mut AndroidRun) -> Next {
        // What a run offers when no path goes on: the first new path, crashed or not.
        let first = children[0].actions.clone();
        let (crashed, children): (Vec<PathNode>, Vec<PathNode>) =
            children.into_iter().partition(|c| c.screen.crash.is_some());
        for c in &crashed {
            let Some(crash) = &c.screen.crash else {
                continue;
            };
            let confirmed = crash_reproduces(&self.cfg, crash, &self.reported);
            // Whether it is the reported crash (none is, on a non-crash report).
            let reported = self.cfg.bug_type == BugType::Crash && crash.is_reported(&self.reported);
            self.note(
                json!({"stage": "crash", "level": level, "path_len": c.actions.len(),
                "exception": crash.exception, "reported": reported, "confirmed": confirmed}),
            );
            if confirmed {
                run.claimed = true;
                run.trace = c.actions.clone();
                run.crash = Some(crash.clone());
                return Next::Reproduced;
            }
        }
        // A crashed path can neither go on nor be the bug any more: the evaluator sees the rest.
        if children.is_empty() {
            run.trace = first;
            return Next::Done;
        }
        let m = self.cfg.second_branch_limit;
        let paths: Vec<Vec<PathStep>> = children.iter().map(|c| c.steps.clone()).collect();
        let (sys, user) = prompts::evaluate(&self.objective, &paths, m);
        let mut llm = self.llm.clone();
        let answer = match ask(&mut llm, &sys, &user, &[]).await {
            Ok(a) => a,
            Err(e) => return Next::Stop(e.into()),
        };
        let eval = prompts::evaluation_of(&answer, children.len(), m);
        self.note(
            json!({"stage": "evaluate", "level": level, "complete": eval.complete,
            "keep": eval.keep}),
        );
        if let Some(c) = eval.complete {
            match self.verify(&children[c]).await {
                Ok(true) => {
                    run.claimed = true;
                    run.trace = children[c].actions.clone();
                    run.crash = children[c].screen.crash.clone();
                    return Next::Done;
                }
                Ok(false) => {}
                Err(s) => return Next::Stop(s),
            }
        }
        let keep = if eval.keep.is_empty() {
            (0..children.len().min(m)).collect()
        } else {
            eval.keep
        };
        let next: Vec<PathNode> = keep
            .into_iter()
            .map(|i| children[i].clone())
            .filter(|c| c.snapshot.is_some())
            .collect();
        // The best path so far is what a run that stops now offers.
        run.trace = next.first().map_or(first, |n| n.actions.clone());
        if next.is_empty() {
            return Next::Done;
        }
        match self.jobs_for(&next).await {
            Ok(jobs) => Next::Level(next, jobs),
            Err(s) => Next::Stop(s),
        }
    }

    /// Runs levels until a verified path, a budget, or no path is left; returns the run. The
    /// evaluation of a level and the candidates of the next run while the level's last
    /// snapshots are still being saved.
    async fn search(&self, root: PathNode) -> Result<AndroidRun, AgentError> {
        let mut run = AndroidRun::default();
        let mut frontier = vec![root];
        let mut level = 0usize;
        let mut jobs = match self.jobs_for(&frontier).await {
            Ok(j) => j,
            Err(s) => return finish(run, Some(s)),
        };
        let stop = loop {
            level += 1;
            if let Err(e) = self.meter.check_time() {
                break Some(Stop::Budget(e));
            }
            let n = jobs.len();
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let workers = self.preassess(&frontier, jobs, tx);
            let evaluation = async {
                let mut slots: Vec<Option<PathNode>> = vec![None; n];
                let mut got = 0;
                while got < n {
                    let Some((i, child)) = rx.recv().await else {
                        // A stop ended the level early; evaluate what was assessed.
                        break;
                    };
                    slots[i] = child;
                    got += 1;
                }
                // Paths in job order, whatever the number of replicas.
                let children: Vec<PathNode> = slots.into_iter().flatten().collect();
                self.note(
                    json!({"stage": "level", "level": level, "paths": frontier.len(),
                    "children": children.len(), "actions_used": self.meter.used()}),
                );
                if children.is_empty() {
                    return (got == n, Next::Done);
                }
                (got == n, self.decide(level, children, &mut run).await)
            };
            let (stopped, (complete_level, next)) = tokio::join!(workers, evaluation);
            match next {
                Next::Done => break stopped,
                // The crash came within the budget (its action was metered): a budget that
                // stopped the level's later jobs does not void it, as the public code checks for
                // a crash right after each action, before its budgets.
                Next::Reproduced => break stopped.filter(|s| matches!(s, Stop::Error(_))),
                Next::Stop(s) => break Some(s),
                Next::Level(_, _) if stopped.is_some() || !complete_level => break stopped,
                Next::Level(f, j) => {
                    frontier = f;
                    jobs = j;
                }
            }
        };
        finish(run, stop)
    }
}

/// What follows a level's evaluation.
enum Next {
    /// The run ends (a verified path, or nothing left to explore).
    Done,
    /// A crashed path reproduces the report: the run ends with it.
    Reproduced,
    /// The run stops on a budget or an error.
    Stop(Stop),
    /// The kept paths and their candidates.
    Level(Vec<PathNode>, Vec<Job>),
}

/// The run, with the budget that stopped it, or the error.
fn finish(mut run: AndroidRun, stop: Option<Stop>) -> Result<AndroidRun, AgentError> {
    match stop {
        Some(Stop::Error(e)) => return Err(e),
        Some(Stop::Budget(b)) => run.exhausted = Some(b),
        None => {}
    }
    Ok(run)
}

/// Runs LTGDroid for `report` on `devices` (the first launches the app; all of them restore
/// snapshots from one store, so they must be replicas of one device) within `meter`'s budget.
pub async fn run<L: Llm + Clone + Sync>(
    llm: &L,
    devices: &[&dyn Device],
    package: &str,
    report: &AndroidReport,
    cfg: Config,
    meter: &Meter,
) -> Result<AndroidRun, AgentError> {
    let Some(primary) = devices.first() else {
        return Err(AgentError::Device(DeviceError::Rejected(
            "ltgdroid needs at least one device".into(),
        )));
    };
    let reported = reported_exceptions(report);
    let report = report_text(report);
    let mut analyzed = None;
    let objective = if cfg.variant.report_analyzer {
        let (sys, user) = prompts::analyze(&report);
        let answer = match ask(&mut llm.clone(), &sys, &user, &[]).await {
            Ok(a) => a,
            Err(e) => return finish(AndroidRun::default(), Some(e.into())),
        };
        let spec = prompts::specification_of(&answer);
        analyzed = Some(json!({"stage": "analyze", "readable": spec.is_some()}));
        spec.unwrap_or_else(|| prompts::raw_objective(&report))
    } else {
        prompts::raw_objective(&report)
    };
    let log = std::iter::once(json!({"stage": "objective", "text": objective,
        "replicas": devices.len()}))
    .chain(analyzed)
    .collect();
    primary.launch(package).await?;
    let screen = capture(*primary).await?;
    let explorer = Explorer {
        llm,
        devices,
        cfg,
        meter,
        objective,
        reported,
        snapshots: AtomicUsize::new(0),
        log: Mutex::new(log),
    };
    let root_snapshot = explorer.next_snapshot();
    primary.save_snapshot(&root_snapshot).await?;
    let root = PathNode {
        actions: Vec::new(),
        steps: Vec::new(),
        snapshot: Some(root_snapshot),
        screen: std::sync::Arc::new(screen),
    };
    let mut run = explorer.search(root).await?;
    run.actions_executed = meter.used();
    run.log = explorer.log.into_inner().unwrap_or_else(|e| e.into_inner());
    Ok(run)
}

#[cfg(test)]
mod tests;
