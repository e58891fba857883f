//! A scripted stand-in for the LLM that answers LTGDroid's prompts by following a report's
//! ground-truth trace. It is NOT a language model: it reads the prompts' fixed sections and
//! compares actions in words with the known answer. Tests use it to drive ltgdroid to a
//! reproduction, and `bench preassess` to time the search with a deterministic policy.
//!
//! Its choices: the analyzer lists the ground-truth steps; the filter keeps the next
//! ground-truth action first and then the other candidates (up to k) on a path that follows the
//! ground truth, and one candidate on any other path; input fields get the ground truth's text;
//! the evaluator keeps on-track paths first and calls complete a path equal to the ground
//! truth; the verifier confirms exactly such a path.

use super::prompts::Stage;
use crate::agent::{describe_action, message_text};
use crate::device::{Action, WidgetRef};
use reprobench_gateway::llm::LlmError;
use serde_json::{Value, json};

/// How the guided policy ranks candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuidedShape {
    /// Candidates kept on a path that follows the ground truth (at most the prompt's k).
    pub on_track_keep: usize,
    /// Candidates kept on any other path.
    pub off_track_keep: usize,
}

impl Default for GuidedShape {
    fn default() -> Self {
        GuidedShape {
            on_track_keep: super::FIRST_BRANCH_LIMIT,
            off_track_keep: 1,
        }
    }
}

/// How prompts name `t`: its short resource id, else its text, else its content-desc.
pub(crate) fn widget_token(t: &WidgetRef) -> String {
    if !t.resource_id.is_empty() {
        let short = t
            .resource_id
            .rsplit_once(":id/")
            .map_or(t.resource_id.as_str(), |(_, s)| s);
        format!("resource-id=\"{short}\"")
    } else if !t.text.is_empty() {
        format!("text=\"{}\"", t.text)
    } else {
        format!("content-desc=\"{}\"", t.content_desc)
    }
}

/// Whether an action in words (as prompts print it) is `gold`; `strict_text` also compares
/// the typed text of inputs.
pub fn words_match(words: &str, gold: &Action, strict_text: bool) -> bool {
    // The widget's id, and its text too when the ground truth names one (list rows share ids).
    let on = |t: &WidgetRef| {
        words.contains(&widget_token(t))
            && (t.text.is_empty() || words.contains(&format!("text=\"{}\"", t.text)))
    };
    match gold {
        Action::Click { target } => words.starts_with("click <") && on(target),
        Action::LongClick { target } => words.starts_with("long-click <") && on(target),
        Action::InputText { target, text } => {
            let prefix = if strict_text {
                format!("input \"{text}\" in <")
            } else {
                "input \"".to_string()
            };
            words.starts_with(&prefix) && on(target)
        }
        Action::Press { .. } | Action::Rotate => words == describe_action(gold),
        Action::Swipe { target, .. } => {
            let head = describe_action(gold);
            let head = head.split(" on ").next().unwrap_or_default();
            words.starts_with(&format!("{head} on ")) && target.as_ref().is_none_or(on)
        }
    }
}

/// The text of the section headed `## name` (up to the next `## `), if present.
pub(crate) fn section<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let head = format!("## {name}\n");
    let start = text.find(&head)? + head.len();
    let rest = &text[start..];
    let end = rest.find("\n## ").map_or(rest.len(), |i| i + 1);
    Some(&rest[..end])
}

/// Path steps' actions in words, from `(n) action => effect` lines.
pub(crate) fn path_actions(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix('(')?;
            let (n, rest) = rest.split_once(") ")?;
            n.parse::<usize>().ok()?;
            Some(rest.split(" => ").next().unwrap_or(rest).to_string())
        })
        .collect()
}

/// How many leading ground-truth actions a path follows, if it follows them all the way.
fn on_track(steps: &[String], gold: &[Action]) -> Option<usize> {
    (steps.len() <= gold.len() && steps.iter().zip(gold).all(|(s, g)| words_match(s, g, true)))
        .then_some(steps.len())
}

/// `[i] words` lines.
pub(crate) fn numbered(text: &str) -> Vec<(usize, String)> {
    text.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix('[')?;
            let (i, words) = rest.split_once("] ")?;
            Some((i.parse().ok()?, words.to_string()))
        })
        .collect()
}

/// Paths of an evaluation prompt (`### Path i` blocks), as actions in words.
pub(crate) fn paths_of(text: &str) -> Vec<Vec<String>> {
    text.split("### Path ")
        .skip(1)
        .map(|block| path_actions(block.split_once('\n').map_or("", |(_, b)| b)))
        .collect()
}

/// The guided answer to one request (system prompt first, then one user message).
pub fn answer(messages: &[Value], gold: &[Action], shape: GuidedShape) -> String {
    let system = messages.first().map(message_text).unwrap_or_default();
    let user = messages.get(1).map(message_text).unwrap_or_default();
    let path = section(&user, "Path so far")
        .or_else(|| section(&user, "Path"))
        .map(path_actions)
        .unwrap_or_default();
    let progress = on_track(&path, gold);
    let next = progress.and_then(|j| gold.get(j));
    match Stage::of_system_prompt(&system) {
        Some(Stage::Analyze) => json!({
            "steps": gold.iter().map(describe_action).collect::<Vec<_>>(),
            "symptoms": ["the bug described in the report shows"],
        })
        .to_string(),
        Some(Stage::Filter) => {
            let candidates = numbered(section(&user, "Candidate actions").unwrap_or_default());
            let hit = next.and_then(|g| {
                candidates
                    .iter()
                    .find(|(_, w)| words_match(w, g, false))
                    .map(|(i, _)| *i)
            });
            let keep_n = if hit.is_some() {
                shape.on_track_keep
            } else {
                shape.off_track_keep
            };
            let mut keep: Vec<usize> = hit.into_iter().collect();
            keep.extend(
                candidates
                    .iter()
                    .map(|(i, _)| *i)
                    .filter(|i| Some(*i) != hit),
            );
            keep.truncate(keep_n);
            json!({ "keep": keep }).to_string()
        }
        Some(Stage::Input) => {
            let field = section(&user, "Field").unwrap_or_default();
            let text = match next {
                Some(Action::InputText { target, text })
                    if field.contains(&widget_token(target)) =>
                {
                    text.clone()
                }
                _ => crate::explore::DEFAULT_INPUT.to_string(),
            };
            json!({ "text": text }).to_string()
        }
        Some(Stage::Summarize) => {
            let action = section(&user, "Action")
                .unwrap_or_default()
                .trim()
                .to_string();
            let after = section(&user, "After")
                .unwrap_or_default()
                .trim()
                .to_string();
            json!({ "summary": format!("{action}; afterwards: {}", after.replace('\n', " ")) })
                .to_string()
        }
        Some(Stage::Evaluate) => {
            let paths = paths_of(section(&user, "Paths").unwrap_or_default());
            let complete = paths
                .iter()
                .position(|p| p.len() == gold.len() && on_track(p, gold).is_some());
            let mut order: Vec<usize> = (0..paths.len())
                .filter(|&i| on_track(&paths[i], gold).is_some())
                .collect();
            let rest: Vec<usize> = (0..paths.len()).filter(|i| !order.contains(i)).collect();
            order.extend(rest);
            order.truncate(super::SECOND_BRANCH_LIMIT);
            json!({ "complete": complete, "keep": order }).to_string()
        }
        Some(Stage::Verify) => {
            json!({ "reproduced": progress == Some(gold.len()), "reason": "scripted check" })
                .to_string()
        }
        Some(Stage::Choose) => {
            let widgets = numbered(section(&user, "Current screen").unwrap_or_default());
            let pick = |t: &WidgetRef| {
                widgets
                    .iter()
                    .find(|(_, w)| w.contains(&widget_token(t)))
                    .map(|(i, _)| *i)
            };
            let (action, widget, text) = match next {
                Some(Action::Click { target }) => ("click", pick(target), None),
                Some(Action::LongClick { target }) => ("long_click", pick(target), None),
                Some(Action::InputText { target, text }) => {
                    ("input", pick(target), Some(text.clone()))
                }
                Some(Action::Press { key }) => (
                    match key {
                        crate::device::Key::Back => "back",
                        crate::device::Key::Enter => "enter",
                        crate::device::Key::Delete => "delete",
                        crate::device::Key::Home => "home",
                    },
                    None,
                    None,
                ),
                Some(Action::Swipe { direction, target }) => (
                    match direction {
                        crate::device::Direction::Up => "swipe_up",
                        crate::device::Direction::Down => "swipe_down",
                        crate::device::Direction::Left => "swipe_left",
                        crate::device::Direction::Right => "swipe_right",
                    },
                    target.as_ref().and_then(pick),
                    None,
                ),
                Some(Action::Rotate) => ("rotate", None, None),
                None => ("back", None, None),
            };
            json!({ "action": action, "widget": widget, "text": text }).to_string()
        }
        None => "this scripted stand-in only answers ltgdroid prompts".to_string(),
    }
}

/// A closure for [`crate::agent::ScriptedLlm`] that answers with [`answer`].
pub fn responder(
    gold: Vec<Action>,
    shape: GuidedShape,
) -> impl Fn(&[Value]) -> Result<String, LlmError> + Send + Sync + 'static {
    move |messages| Ok(answer(messages, &gold, shape))
}
