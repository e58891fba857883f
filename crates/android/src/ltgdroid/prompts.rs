//! LTGDroid's prompts (the structure of the paper's Fig. 3, in our own words) and the readers of
//! their answers. All pure.
//!
//! Every system prompt's first line is `ltgdroid stage: <stage>` (see [`Stage`]); scripted test
//! servers and logs match on it. User messages use fixed section headers (`## Reproduction
//! specification`, `## Path so far`, `## Candidate actions`, `## Paths`, `### Path N`), and list
//! candidates as `[i] <action>` and path steps as `(n) <action> => <effect>`.

use crate::agent::{index_list, parse_json_answer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt::Write;

/// The prefix of every system prompt's first line.
pub const STAGE_MARKER_PREFIX: &str = "ltgdroid stage: ";

/// An LLM stage of LTGDroid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Report Analyzer: steps to reproduce and observable symptoms (Fig. 3(a)).
    Analyze,
    /// Path Explorer: keep the top-k candidate actions of a screen (Fig. 3(b)).
    Filter,
    /// Text for an input action (Fig. 3(c)).
    Input,
    /// Transition summary from before/after screens (Fig. 3(d)).
    Summarize,
    /// Path Evaluator: keep the top-m paths, say whether one is complete (Fig. 3(e)).
    Evaluate,
    /// Bug Verifier for non-crash bugs: does the final screen show the symptom (Fig. 3(f)).
    Verify,
    /// `no-ae` only: choose one next action from the widget list, without enumeration.
    Choose,
}

impl Stage {
    /// The stage's name in the marker.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Analyze => "analyze",
            Stage::Filter => "filter",
            Stage::Input => "input",
            Stage::Summarize => "summarize",
            Stage::Evaluate => "evaluate",
            Stage::Verify => "verify",
            Stage::Choose => "choose",
        }
    }

    /// Every stage.
    pub const ALL: [Stage; 7] = [
        Stage::Analyze,
        Stage::Filter,
        Stage::Input,
        Stage::Summarize,
        Stage::Evaluate,
        Stage::Verify,
        Stage::Choose,
    ];

    /// The stage a system prompt's first line names.
    pub fn of_system_prompt(text: &str) -> Option<Stage> {
        let first = text.lines().next()?.strip_prefix(STAGE_MARKER_PREFIX)?;
        Stage::ALL.into_iter().find(|s| s.name() == first.trim())
    }
}

/// A system prompt: the stage marker, then the instructions.
fn system(stage: Stage, body: &str) -> String {
    format!("{STAGE_MARKER_PREFIX}{}\n{body}", stage.name())
}

/// One step of an exploration path as prompts show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathStep {
    /// The action in words.
    pub action: String,
    /// What it did (the transition summary); `None` when transitions are not assessed.
    pub effect: Option<String>,
}

/// Writes a path as numbered steps, or says it is empty.
fn write_path(out: &mut String, steps: &[PathStep]) {
    if steps.is_empty() {
        out.push_str("(no actions yet: the app was just launched)\n");
    }
    for (i, s) in steps.iter().enumerate() {
        match &s.effect {
            Some(e) => writeln!(out, "({}) {} => {}", i + 1, s.action, one_line(e)),
            None => writeln!(out, "({}) {}", i + 1, s.action),
        }
        .expect("writing to a String");
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What a screen looks like in a prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScreenText {
    /// Foreground activity.
    pub activity: String,
    /// The widget list (XML-like lines).
    pub widgets: Vec<String>,
}

fn write_screen(out: &mut String, s: &ScreenText) {
    writeln!(out, "Activity: {}", s.activity).expect("writing to a String");
    for w in &s.widgets {
        writeln!(out, "  {w}").expect("writing to a String");
    }
}

/// Report Analyzer: (system, user) prompts from the whole report text.
pub fn analyze(report: &str) -> (String, String) {
    let sys = system(
        Stage::Analyze,
        "You help reproduce an Android app bug from a user's report. Read the whole report, \
         including the comments, and distil it into a reproduction specification: the ordered \
         steps a tester performs in the app from a fresh start (fill in obvious steps the \
         reporter skipped, such as getting past a welcome screen or creating the item the bug \
         needs), and the symptoms a tester would observe on screen when the bug shows (a crash \
         dialog, a wrong value, a missing element). Leave out speculation about causes, logs and \
         device details that do not change what to do.\n\
         Answer with JSON only: {\"steps\": [\"...\"], \"symptoms\": [\"...\"]}",
    );
    let user = format!("## Bug report\n{report}\n");
    (sys, user)
}

/// The specification text the later stages use, from the analyzer's answer; `None` when the
/// answer has no steps or symptoms.
pub fn specification_of(answer: &str) -> Option<String> {
    let v = parse_json_answer(answer)?;
    let list = |k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (steps, symptoms) = (list("steps"), list("symptoms"));
    if steps.is_empty() && symptoms.is_empty() {
        return None;
    }
    let mut out = String::from("Steps to reproduce:\n");
    for (i, s) in steps.iter().enumerate() {
        writeln!(out, "{}. {s}", i + 1).expect("writing to a String");
    }
    out.push_str("Observable symptoms:\n");
    for s in &symptoms {
        writeln!(out, "- {s}").expect("writing to a String");
    }
    Some(out)
}

/// The objective when the Report Analyzer is off (`no-ra`): the raw report.
pub fn raw_objective(report: &str) -> String {
    format!("The user's bug report, unprocessed:\n{report}")
}

/// Path Explorer's filter: (system, user) prompts; the screenshot goes with the user message.
pub fn filter(
    objective: &str,
    path: &[PathStep],
    screen: &ScreenText,
    candidates: &[String],
    keep: usize,
) -> (String, String) {
    let sys = system(
        Stage::Filter,
        &format!(
            "You explore an Android app to reproduce a bug. Given the reproduction \
             specification, the actions performed so far on this exploration path, and the \
             current screen (widget list and screenshot), pick the candidate actions most likely \
             to move the app toward showing the bug. Discard actions unrelated to the \
             specification. Keep at most {keep}, most promising first.\n\
             Answer with JSON only: {{\"keep\": [candidate indices]}}"
        ),
    );
    let mut user = format!("## Reproduction specification\n{objective}\n\n## Path so far\n");
    write_path(&mut user, path);
    user.push_str("\n## Current screen\n");
    write_screen(&mut user, screen);
    user.push_str("\n## Candidate actions\n");
    for (i, c) in candidates.iter().enumerate() {
        writeln!(user, "[{i}] {c}").expect("writing to a String");
    }
    (sys, user)
}

/// The indices the filter kept, in its order, deduplicated, in range, at most `keep`.
pub fn kept_indices(answer: &str, n: usize, keep: usize, field: &str) -> Vec<usize> {
    let Some(v) = parse_json_answer(answer) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for i in index_list(&v, field) {
        if i < n && !out.contains(&i) && out.len() < keep {
            out.push(i);
        }
    }
    out
}

/// Text generation for an input action: (system, user).
pub fn input(objective: &str, path: &[PathStep], widget: &str) -> (String, String) {
    let sys = system(
        Stage::Input,
        "You fill in a text field while reproducing an Android app bug. Choose the text a \
         tester would type into this field to follow the reproduction specification (use the \
         exact values the report mentions when it mentions any; otherwise a realistic value).\n\
         Answer with JSON only: {\"text\": \"...\"}",
    );
    let mut user = format!("## Reproduction specification\n{objective}\n\n## Path so far\n");
    write_path(&mut user, path);
    writeln!(user, "\n## Field\n{widget}").expect("writing to a String");
    (sys, user)
}

/// The text an input answer gives; `None` when it gives none.
pub fn input_text_of(answer: &str) -> Option<String> {
    parse_json_answer(answer)?
        .get("text")
        .and_then(|t| match t {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
}

/// Transition summary: (system, user); the before and after screenshots go with it, in that
/// order.
pub fn summarize(
    action: &str,
    before_activity: &str,
    after_activity: &str,
    crash: Option<&str>,
) -> (String, String) {
    let sys = system(
        Stage::Summarize,
        "You describe what one UI action did in an Android app, from the screenshots before and \
         after it and the foreground activity. Say what the action does, then what changed on \
         screen and in the app's state: widgets added or removed, visibility changes, changed \
         content or values, layout shifts, and screen or activity switches. Describe only what a \
         user can observe.\n\
         Answer with JSON only: {\"summary\": \"...\"}",
    );
    let mut user = format!(
        "## Action\n{action}\n\n## Before\nActivity: {before_activity} (first screenshot)\n\n\
         ## After\nActivity: {after_activity} (second screenshot)\n"
    );
    if let Some(c) = crash {
        writeln!(user, "A crash dialog is shown: {c}").expect("writing to a String");
    }
    (sys, user)
}

/// The summary an answer gives (the JSON's `summary`, else the trimmed text).
pub fn summary_of(answer: &str) -> String {
    parse_json_answer(answer)
        .and_then(|v| v.get("summary").and_then(Value::as_str).map(str::to_string))
        .unwrap_or_else(|| one_line(answer))
}

/// Path Evaluator: (system, user) over the candidate paths of this level.
pub fn evaluate(objective: &str, paths: &[Vec<PathStep>], keep: usize) -> (String, String) {
    let sys = system(
        Stage::Evaluate,
        &format!(
            "You judge exploration paths of an Android app against a bug's reproduction \
             specification. For each path, decide whether it is worth exploring further, and \
             whether it has already made the bug show (every needed step done and the symptom \
             observed). A path that has fallen into a loop is not worth exploring further; of \
             paths that behave the same or reach the same outcome, keep only the most promising \
             one. Keep at most {keep} paths, most promising first. Name a complete path only \
             when its last step shows the described symptom.\n\
             Answer with JSON only: {{\"complete\": <path index or null>, \"keep\": [path indices]}}"
        ),
    );
    let mut user = format!("## Reproduction specification\n{objective}\n\n## Paths\n");
    for (i, p) in paths.iter().enumerate() {
        writeln!(user, "### Path {i}").expect("writing to a String");
        write_path(&mut user, p);
    }
    (sys, user)
}

/// The evaluator's verdict: the complete path, if any, and the kept paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evaluation {
    /// A path said to reproduce the bug.
    pub complete: Option<usize>,
    /// Paths to expand next, best first.
    pub keep: Vec<usize>,
}

/// Reads an evaluation over `n` paths, keeping at most `keep`.
pub fn evaluation_of(answer: &str, n: usize, keep: usize) -> Evaluation {
    let complete = parse_json_answer(answer)
        .and_then(|v| v.get("complete").and_then(Value::as_u64))
        .map(|i| i as usize)
        .filter(|&i| i < n);
    Evaluation {
        complete,
        keep: kept_indices(answer, n, keep, "keep"),
    }
}

/// Bug Verifier for non-crash bugs: (system, user); the final screenshot goes with it.
pub fn verify(objective: &str, path: &[PathStep], activity: &str) -> (String, String) {
    let sys = system(
        Stage::Verify,
        "You verify a claimed reproduction of an Android app bug. Look at the final screenshot \
         and decide whether it shows the symptom the specification describes, exactly as \
         described, not merely a similar screen.\n\
         Answer with JSON only: {\"reproduced\": true|false, \"reason\": \"...\"}",
    );
    let mut user = format!("## Reproduction specification\n{objective}\n\n## Path\n");
    write_path(&mut user, path);
    writeln!(user, "\n## Final screen\nActivity: {activity} (screenshot)")
        .expect("writing to a String");
    (sys, user)
}

/// The verifier's answer: `Some(true)` confirmed, `Some(false)` rejected, `None` unreadable.
pub fn verdict_of(answer: &str) -> Option<bool> {
    parse_json_answer(answer)?
        .get("reproduced")
        .and_then(Value::as_bool)
}

/// `no-ae`: choose one next action from the widget list, without pre-assessment.
pub fn choose(objective: &str, path: &[PathStep], screen: &ScreenText) -> (String, String) {
    let sys = system(
        Stage::Choose,
        "You explore an Android app to reproduce a bug. Given the reproduction specification, \
         the actions performed so far and the current screen (numbered widget list and \
         screenshot), choose the single next action. Actions: click, long_click, input (give \
         the text), swipe_up, swipe_down, swipe_left, swipe_right (on a widget or the screen), \
         back, enter, delete, home, rotate (no widget).\n\
         Answer with JSON only: {\"action\": \"...\", \"widget\": <index or null>, \"text\": \"...\"}",
    );
    let mut user = format!("## Reproduction specification\n{objective}\n\n## Path so far\n");
    write_path(&mut user, path);
    writeln!(user, "\n## Current screen\nActivity: {}", screen.activity)
        .expect("writing to a String");
    for (i, w) in screen.widgets.iter().enumerate() {
        writeln!(user, "[{i}] {w}").expect("writing to a String");
    }
    (sys, user)
}

/// The `no-ae` choice: action name, widget index and text.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// Action name as the prompt lists them.
    pub action: String,
    /// Widget index, if any.
    pub widget: Option<usize>,
    /// Text for `input`.
    pub text: Option<String>,
}

/// Reads a `no-ae` choice.
pub fn choice_of(answer: &str) -> Option<Choice> {
    let v = parse_json_answer(answer)?;
    Some(Choice {
        action: v.get("action")?.as_str()?.trim().to_lowercase(),
        widget: v.get("widget").and_then(Value::as_u64).map(|i| i as usize),
        text: v.get("text").and_then(Value::as_str).map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_markers_round_trip() {
        for s in Stage::ALL {
            let (sys, _) = match s {
                Stage::Analyze => analyze("r"),
                Stage::Filter => filter("o", &[], &ScreenText::default(), &[], 6),
                Stage::Input => input("o", &[], "<EditText/>"),
                Stage::Summarize => summarize("a", "x", "y", None),
                Stage::Evaluate => evaluate("o", &[], 3),
                Stage::Verify => verify("o", &[], "x"),
                Stage::Choose => choose("o", &[], &ScreenText::default()),
            };
            assert_eq!(Stage::of_system_prompt(&sys), Some(s));
        }
        assert_eq!(Stage::of_system_prompt("something else"), None);
    }

    #[test]
    fn answers_are_read_leniently() {
        let spec = specification_of(
            "```json\n{\"steps\": [\"Open settings\", \" \"], \"symptoms\": [\"NaN shown\"]}\n```",
        )
        .unwrap();
        assert_eq!(
            spec,
            "Steps to reproduce:\n1. Open settings\nObservable symptoms:\n- NaN shown\n"
        );
        assert_eq!(specification_of("{\"steps\": []}"), None);
        assert_eq!(
            kept_indices("{\"keep\": [3, 3, 9, 1, 0]}", 4, 2, "keep"),
            [3, 1]
        );
        let e = evaluation_of("{\"complete\": 1, \"keep\": [1, 0]}", 2, 3);
        assert_eq!(e.complete, Some(1));
        assert_eq!(evaluation_of("{\"complete\": 5}", 2, 3).complete, None);
        assert_eq!(input_text_of("{\"text\": 250}").as_deref(), Some("250"));
        assert_eq!(verdict_of("no"), None);
        assert_eq!(summary_of("it opened\n the list"), "it opened the list");
        let c = choice_of("{\"action\": \"Click\", \"widget\": 2}").unwrap();
        assert_eq!((c.action.as_str(), c.widget), ("click", Some(2)));
    }

    /// Screens are not merged (every action leads to a new state): as in the public code, the
    /// evaluator is the one told to drop looping paths and paths that do the same.
    #[test]
    fn the_evaluator_drops_loops_and_duplicates() {
        let (sys, _) = evaluate("spec", &[], 3);
        assert!(sys.contains("A path that has fallen into a loop is not worth exploring"));
        assert!(sys.contains("reach the same outcome, keep only the most promising one"));
    }

    #[test]
    fn paths_are_numbered_with_their_effects() {
        let (_, user) = evaluate(
            "spec",
            &[vec![
                PathStep {
                    action: "click <Button text=\"Add\"/>".into(),
                    effect: Some("opens\nthe editor".into()),
                },
                PathStep {
                    action: "press back".into(),
                    effect: None,
                },
            ]],
            3,
        );
        assert!(user.contains(
            "### Path 0\n(1) click <Button text=\"Add\"/> => opens the editor\n(2) press back\n"
        ));
    }
}
