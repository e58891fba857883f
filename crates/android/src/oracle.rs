//! The android agents' oracle backbone: [`AndroidOracle`] answers the LLM requests of `ltgdroid`
//! (every variant), `rebl`, `rebl-visual` and `adbgpt` as a perfect model that knows each
//! report's ground truth would. It is NOT a language model: it proves the pipeline (agent →
//! device → verdict) works without one, and its answers must be called an oracle's wherever
//! they appear.
//!
//! It is stateless: an answer depends on the request body alone (the OpenAI chat-completions
//! body the agent sends, as [`reprobench_gateway::llm::request_body`] builds it), never on
//! earlier requests or on a device, so requests of many concurrent tasks may interleave. From
//! the body it reads:
//! - the agent and stage: ltgdroid's `ltgdroid stage: <stage>` first system-prompt line, and
//!   the baselines' [`REBL_MARKER`], [`ADBGPT_EXTRACT_MARKER`] and [`ADBGPT_MATCH_MARKER`];
//! - the report: its text (title, body, comments) where the prompt carries it, else the
//!   reproduction specification this oracle wrote for it (ltgdroid's later stages), else the
//!   steps this oracle extracted for it (AdbGPT's matching, `Step i of n: <step>`);
//! - the progress: the path so far (ltgdroid), the progress its previous answer stated and the
//!   feedback on that answer's action (ReBL), the step number (AdbGPT); and what to do next
//!   from the screen's candidate actions or widget list in the prompt.
//!
//! A perfect model is bounded by the agent's action space: when the next ground-truth action
//! is not among the candidates, ReBL gives up and AdbGPT answers that no candidate performs
//! the step.

use crate::agent::{describe_action, message_text, report_text};
use crate::baselines::{ADBGPT_EXTRACT_MARKER, ADBGPT_MATCH_MARKER, REBL_MARKER, S2rStep};
use crate::device::{Action, Direction, Key, WidgetRef};
use crate::explore::DEFAULT_INPUT;
use crate::ltgdroid::guided::{
    numbered, path_actions, paths_of, section, widget_token, words_match,
};
use crate::ltgdroid::prompts::{self, Stage};
use crate::sim::{BugKind, Dataset, SimReport};
use serde_json::{Value, json};

/// What the oracle knows of one report, and the texts that identify it in prompts.
#[derive(Debug, Clone)]
struct Known {
    /// The report as prompts carry it ([`report_text`]).
    text: String,
    /// ltgdroid's Report Analyzer answer for it.
    analysis: String,
    /// The specification ltgdroid makes of that answer.
    spec: String,
    /// AdbGPT's extraction answer for it.
    extraction: String,
    /// The words of the extracted steps, as AdbGPT's matching prompts show them.
    step_words: Vec<String>,
    /// The ground truth.
    gold: Vec<Action>,
}

/// Answers the android agents' LLM requests as a perfect model that knows each report's ground truth would.
#[derive(Debug, Clone)]
pub struct AndroidOracle {
    reports: Vec<Known>,
}

/// The prefix of the progress ReBL answers state in their thought.
const REBL_PROGRESS: &str = "Ground-truth progress: ";

impl AndroidOracle {
    /// An oracle for the reports of `dataset` (crate::sim::Dataset, loaded from datasets/android-sim).
    pub fn new(dataset: &Dataset) -> Self {
        let reports = dataset
            .reports
            .values()
            .map(|r| {
                let analysis = analysis_of(r);
                let spec = prompts::specification_of(&analysis).unwrap_or_default();
                let steps = extraction_steps(&r.ground_truth);
                let step_words = steps
                    .iter()
                    .filter_map(S2rStep::from_value)
                    .map(|s| s.words())
                    .collect();
                let extraction = format!(
                    "Reasoning: the report's steps, each written with the closest action \
                     primitive.\nAnswer: {}",
                    json!({ "steps": steps })
                );
                Known {
                    text: report_text(&r.android_report()),
                    analysis,
                    spec,
                    extraction,
                    step_words,
                    gold: r.ground_truth.clone(),
                }
            })
            .collect();
        AndroidOracle { reports }
    }

    /// The assistant message a perfect model would send for this OpenAI chat-completions request body
    /// (`{"messages": [...], "tools": ...}`): a JSON object `{"content": <string or null>, "tool_calls": [{"name": ..., "arguments": "<json string>"}]}`,
    /// or None when the request is not one of the android agents' (so another oracle can answer it).
    ///
    /// Also `None` for an android agent's request about a report this oracle does not know.
    pub fn answer(&self, request: &Value) -> Option<Value> {
        let messages = request.get("messages")?.as_array()?;
        let system = messages
            .first()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("system"))
            .map(message_text)?;
        let marker = system.lines().next().unwrap_or_default().trim();
        let content = if let Some(stage) = Stage::of_system_prompt(&system) {
            self.ltgdroid(stage, messages)?
        } else if marker == REBL_MARKER {
            self.rebl(messages)?
        } else if marker == ADBGPT_EXTRACT_MARKER {
            self.identify(&all_text(messages))?.extraction.clone()
        } else if marker == ADBGPT_MATCH_MARKER {
            self.adbgpt_match(messages)?
        } else {
            return None;
        };
        Some(json!({ "content": content, "tool_calls": [] }))
    }

    /// The known report whose text or specification `text` carries (the longest such, so a
    /// report whose text is part of another's does not shadow it).
    fn identify(&self, text: &str) -> Option<&Known> {
        self.reports
            .iter()
            .filter_map(|k| {
                [&k.text, &k.spec]
                    .into_iter()
                    .filter(|key| !key.is_empty() && text.contains(key.as_str()))
                    .map(|key| key.len())
                    .max()
                    .map(|len| (len, k))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, k)| k)
    }

    /// An answer to one of ltgdroid's stages.
    fn ltgdroid(&self, stage: Stage, messages: &[Value]) -> Option<String> {
        let user = messages.get(1).map(message_text).unwrap_or_default();
        if stage == Stage::Summarize {
            // A transition needs no report: it is described from what the prompt shows.
            return Some(json!({ "summary": transition_summary(&user) }).to_string());
        }
        let known = self.identify(&all_text(messages))?;
        let gold = &known.gold;
        let path = section(&user, "Path so far")
            .or_else(|| section(&user, "Path"))
            .map(path_actions)
            .unwrap_or_default();
        let progress = progress_of(&path, gold);
        let next = progress.and_then(|j| gold.get(j));
        Some(match stage {
            Stage::Analyze => known.analysis.clone(),
            Stage::Filter => {
                let candidates = numbered(section(&user, "Candidate actions").unwrap_or_default());
                let keep: Vec<usize> = next
                    .and_then(|g| candidate_index(&candidates, g))
                    .into_iter()
                    .collect();
                json!({ "keep": keep }).to_string()
            }
            Stage::Input => {
                let field = section(&user, "Field").unwrap_or_default();
                let text = match next {
                    Some(Action::InputText { target, text })
                        if field.contains(&widget_token(target)) =>
                    {
                        text.clone()
                    }
                    _ => DEFAULT_INPUT.to_string(),
                };
                json!({ "text": text }).to_string()
            }
            Stage::Evaluate => {
                let paths = paths_of(section(&user, "Paths").unwrap_or_default());
                let complete = paths
                    .iter()
                    .position(|p| progress_of(p, gold) == Some(gold.len()));
                // Only paths on the ground truth are worth exploring further.
                let keep: Vec<usize> = (0..paths.len())
                    .filter(|&i| progress_of(&paths[i], gold).is_some())
                    .take(crate::ltgdroid::SECOND_BRANCH_LIMIT)
                    .collect();
                json!({ "complete": complete, "keep": keep }).to_string()
            }
            Stage::Verify => {
                let done = progress == Some(gold.len());
                let reason = if done {
                    "the path performs every step of the reproduction, so the final screen \
                     shows the symptom"
                } else {
                    "the path has not performed every step of the reproduction"
                };
                json!({ "reproduced": done, "reason": reason }).to_string()
            }
            Stage::Choose => {
                let widgets = numbered(section(&user, "Current screen").unwrap_or_default());
                choice(next, &widgets).to_string()
            }
            Stage::Summarize => unreachable!("answered above"),
        })
    }

    /// ReBL's next step: the candidate that performs the next ground-truth action, "reproduced"
    /// once every one is done, or giving up when the next one is not a candidate.
    fn rebl(&self, messages: &[Value]) -> Option<String> {
        let known = self.identify(&all_text(messages))?;
        let gold = &known.gold;
        let current = message_text(messages.last()?);
        let done = rebl_progress(messages, gold);
        let Some(next) = gold.get(done) else {
            return Some(
                json!({
                    "thought": format!(
                        "{REBL_PROGRESS}{done} of {} steps done: the screen now shows the bug \
                         of the report.",
                        gold.len()
                    ),
                    "status": "reproduced",
                })
                .to_string(),
            );
        };
        let candidates = current
            .split_once("Candidate actions:")
            .map(|(_, c)| numbered(c))
            .unwrap_or_default();
        let words = describe_action(next);
        Some(match candidate_index(&candidates, next) {
            Some(i) => json!({
                "thought": format!(
                    "{REBL_PROGRESS}{done} of {} steps done; next: {words}",
                    gold.len()
                ),
                "action": i,
                "text": typed(next),
            }),
            None => json!({
                "thought": format!(
                    "{REBL_PROGRESS}{done} of {} steps done; the next step ({words}) is not among \
                     the candidate actions, so the bug cannot be reproduced with them.",
                    gold.len()
                ),
                "status": "give_up",
            }),
        }
        .to_string())
    }

    /// AdbGPT's match of one extracted step: the candidate that performs the step's
    /// ground-truth action, or -1.
    fn adbgpt_match(&self, messages: &[Value]) -> Option<String> {
        let user = messages.get(1).map(message_text)?;
        let (i, n, words) = user.lines().find_map(step_line)?;
        let known = self
            .reports
            .iter()
            .find(|k| k.step_words.len() == n && k.step_words.get(i - 1) == Some(&words))?;
        let gold = known.gold.get(i - 1)?;
        let candidates = user
            .split_once("Candidate actions:")
            .map(|(_, c)| numbered(c))
            .unwrap_or_default();
        Some(
            match candidate_index(&candidates, gold) {
                Some(c) => json!({ "index": c, "text": typed(gold) }),
                None => json!({ "index": -1 }),
            }
            .to_string(),
        )
    }
}

/// The text of every message, in order.
fn all_text(messages: &[Value]) -> String {
    messages
        .iter()
        .map(message_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether an action in words (as prompts print it) does what `gold` does: the same action,
/// or a screen-wide swipe in a targeted swipe's direction (which scrolls the screen's
/// scrollable widget).
fn follows(words: &str, gold: &Action, strict_text: bool) -> bool {
    words_match(words, gold, strict_text)
        || matches!(gold, Action::Swipe { direction, target: Some(_) }
            if words == describe_action(&Action::Swipe { direction: *direction, target: None }))
}

/// The candidate (`[i] words`) that performs `gold`: the same action, else the screen-wide
/// swipe for a targeted one.
fn candidate_index(candidates: &[(usize, String)], gold: &Action) -> Option<usize> {
    candidates
        .iter()
        .find(|(_, w)| words_match(w, gold, false))
        .or_else(|| candidates.iter().find(|(_, w)| follows(w, gold, false)))
        .map(|(i, _)| *i)
}

/// How many ground-truth actions a path follows, when it follows them all the way.
fn progress_of(steps: &[String], gold: &[Action]) -> Option<usize> {
    (steps.len() <= gold.len() && steps.iter().zip(gold).all(|(s, g)| follows(s, g, true)))
        .then_some(steps.len())
}

/// The text an action types, if it is an input.
fn typed(a: &Action) -> Option<&str> {
    match a {
        Action::InputText { text, .. } => Some(text),
        _ => None,
    }
}

/// ltgdroid's analysis of a report by a model that knows its ground truth: the ground-truth
/// actions as steps, and the verifier's symptom (naming the report's title).
fn analysis_of(r: &SimReport) -> String {
    let title = r.title.trim();
    let symptom = match (r.kind, &r.exception, &r.symptom) {
        (BugKind::Crash, Some(e), _) => format!("{title}: the app crashes with {e}"),
        (BugKind::Crash, None, _) => format!("{title}: the app crashes"),
        (BugKind::NonCrash, _, Some(s)) => {
            let id = s
                .resource_id
                .rsplit_once(":id/")
                .map_or(s.resource_id.as_str(), |(_, id)| id);
            format!("{title}: the widget {id} shows \"{}\"", s.text)
        }
        (BugKind::NonCrash, _, None) => {
            format!("{title}: the wrong behaviour the report describes shows")
        }
    };
    json!({
        "steps": r.ground_truth.iter().map(describe_action).collect::<Vec<_>>(),
        "symptoms": [symptom],
    })
    .to_string()
}

/// The ground truth as AdbGPT's steps-to-reproduce entities, each with the closest of its
/// action primitives (as its own few-shot example does: "go back" becomes a tap on "back").
fn extraction_steps(gold: &[Action]) -> Vec<Value> {
    let name = |w: &WidgetRef| {
        if !w.text.is_empty() {
            w.text.clone()
        } else if !w.content_desc.is_empty() {
            w.content_desc.clone()
        } else {
            let id = w
                .resource_id
                .rsplit_once(":id/")
                .map_or(w.resource_id.as_str(), |(_, s)| s);
            id.replace('_', " ")
        }
    };
    let step = |action: &str, component: String, input: &str, direction: &str| {
        json!({
            "action": action,
            "component": component,
            "input": input,
            "direction": direction,
        })
    };
    gold.iter()
        .map(|a| match a {
            Action::Click { target } => step("tap", name(target), "", ""),
            Action::LongClick { target } => step("long_tap", name(target), "", ""),
            Action::InputText { target, text } => step("input", name(target), text, ""),
            // AdbGPT scrolls name where the content goes: the finger moves the other way.
            Action::Swipe { direction, .. } => {
                let towards = match direction {
                    Direction::Up => "down",
                    Direction::Down => "up",
                    Direction::Left => "right",
                    Direction::Right => "left",
                };
                step("scroll", String::new(), "", towards)
            }
            Action::Press { key } => {
                let key = match key {
                    Key::Back => "back",
                    Key::Enter => "enter",
                    Key::Delete => "delete",
                    Key::Home => "home",
                };
                step("tap", key.to_string(), "", "")
            }
            Action::Rotate => step("tap", "rotate".to_string(), "", ""),
        })
        .collect()
}

/// `Step i of n: words` of an AdbGPT matching prompt.
fn step_line(line: &str) -> Option<(usize, usize, String)> {
    let rest = line.strip_prefix("Step ")?;
    let (i, rest) = rest.split_once(" of ")?;
    let (n, words) = rest.split_once(": ")?;
    let (i, n) = (i.parse().ok()?, n.parse().ok()?);
    (i >= 1).then(|| (i, n, words.to_string()))
}

/// How many ground-truth actions a ReBL run has done: the progress its last answer stated,
/// plus one when the feedback says that answer's action (the next ground-truth one) was done;
/// without a stated progress, the feedback of every visible step replayed against the ground
/// truth.
fn rebl_progress(messages: &[Value], gold: &[Action]) -> usize {
    let current = messages.last().map(message_text).unwrap_or_default();
    let stated = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
        .map(message_text)
        .and_then(|a| stated_progress(&a));
    let advanced = |done: usize, text: &str| match performed(text) {
        Some(words) if gold.get(done).is_some_and(|g| follows(&words, g, true)) => done + 1,
        _ => done,
    };
    match stated {
        Some(done) => advanced(done, &current),
        None => messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map(message_text)
            .fold(0, |done, text| advanced(done, &text)),
    }
}

/// The progress a ReBL answer of this oracle states in its thought.
fn stated_progress(answer: &str) -> Option<usize> {
    let v = crate::agent::parse_json_answer(answer)?;
    let thought = v.get("thought")?.as_str()?;
    let rest = &thought[thought.find(REBL_PROGRESS)? + REBL_PROGRESS.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

/// The action ReBL's feedback says was done (`you did `words`.`), unless it could not be.
fn performed(text: &str) -> Option<String> {
    let rest = text
        .split_once("Feedback on your previous answer: you did `")?
        .1;
    let (words, after) = rest.split_once("`. ")?;
    (!after.starts_with("The action could not be performed")).then(|| words.to_string())
}

/// A `no-ae` choice (`{"action", "widget", "text"}`) for the next ground-truth action among
/// the numbered widgets; `back` off the ground truth.
fn choice(next: Option<&Action>, widgets: &[(usize, String)]) -> Value {
    let pick = |t: &WidgetRef| {
        widgets
            .iter()
            .find(|(_, w)| {
                w.contains(&widget_token(t))
                    && (t.text.is_empty() || w.contains(&format!("text=\"{}\"", t.text)))
            })
            .map(|(i, _)| *i)
    };
    let (action, widget, text) = match next {
        Some(Action::Click { target }) => ("click", pick(target), None),
        Some(Action::LongClick { target }) => ("long_click", pick(target), None),
        Some(Action::InputText { target, text }) => ("input", pick(target), Some(text.clone())),
        Some(Action::Press { key }) => (
            match key {
                Key::Back => "back",
                Key::Enter => "enter",
                Key::Delete => "delete",
                Key::Home => "home",
            },
            None,
            None,
        ),
        Some(Action::Swipe { direction, target }) => (
            match direction {
                Direction::Up => "swipe_up",
                Direction::Down => "swipe_down",
                Direction::Left => "swipe_left",
                Direction::Right => "swipe_right",
            },
            target.as_ref().and_then(pick),
            None,
        ),
        Some(Action::Rotate) => ("rotate", None, None),
        None => ("back", None, None),
    };
    json!({ "action": action, "widget": widget, "text": text })
}

/// A transition as the summarize prompt's text shows it: the action, the activities before
/// and after, and the crash (the oracle does not read screenshots).
fn transition_summary(user: &str) -> String {
    let action = section(user, "Action").unwrap_or_default().trim();
    let activity = |name: &str| {
        section(user, name)
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Activity: ")))
            .map(|l| l.split(" (").next().unwrap_or(l).trim().to_string())
            .unwrap_or_default()
    };
    let (before, after) = (activity("Before"), activity("After"));
    let mut out = format!("The action `{action}` was performed; ");
    if before == after {
        out.push_str(&format!("the app stays on {after}."));
    } else {
        out.push_str(&format!("the screen switches from {before} to {after}."));
    }
    if let Some(crash) = section(user, "After").and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("A crash dialog is shown: "))
    }) {
        out.push_str(&format!(" A crash dialog is shown: {crash}."));
    }
    out
}

#[cfg(test)]
mod tests;
