//! Two LLM baselines of the android bug-reproduction track, written from their papers' method
//! descriptions:
//!
//! - ReBL (Wang et al., ISSTA 2024): no steps-to-reproduce extraction; the model reads the whole
//!   report and drives the app one action per call, told after each action what it did
//!   (feedback-driven). `visual` (ReBL-visual) adds the current screenshot to every step.
//! - AdbGPT (Feng & Chen, ICSE 2024): extracts steps-to-reproduce entities from the report with
//!   a few-shot chain-of-thought prompt, then replays them, asking for each step which action of
//!   the current screen performs it.
//!
//! Each offers the actions of its own method ([`REBL_RULES`], [`ADBGPT_RULES`]), and each system
//! prompt's first line names the agent and stage ([`REBL_MARKER`], [`ADBGPT_EXTRACT_MARKER`],
//! [`ADBGPT_MATCH_MARKER`]) for scripted servers, oracles and logs.

use super::agent::{
    AgentError, AndroidRun, Exhausted, Meter, describe_action, parse_json_answer, report_text,
    user_message, widget_lines,
};
use super::device::{Action, Device, DeviceError, Direction, Key};
use super::explore::{ActionRules, DEFAULT_INPUT, enumerate_with};
use reprobench_domain::android::AndroidReport;
use reprobench_gateway::llm::{Llm, LlmError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Earlier ReBL steps (user message and answer) kept in the conversation.
const REBL_HISTORY_STEPS: usize = 15;

/// ReBL's actions, from its public code (datareviewtest/ReBL at 8c9ce57: the action list in
/// `Automation/prompts/training_prompts_ori.json` and `handle_command.py`): click and long_click
/// on a widget (text fields too), set_text into a field, scroll up and down on a scrollable
/// widget, swipe up, down, left and right on the screen, back, and orientation. Its `restart`,
/// `wait` and `multiple_selection` (a long-click then clicks) are left out: a trace has no
/// relaunch or wait, and the third is a sequence of the others. It has no Enter key. The ReBL
/// paper is not in our paper set, so its code is the source here.
pub const REBL_RULES: ActionRules = ActionRules {
    click_text_fields: true,
    swipes: &[Direction::Up, Direction::Down],
    keys: &[Key::Back],
    screen_swipes: &[
        Direction::Up,
        Direction::Down,
        Direction::Left,
        Direction::Right,
    ],
    rotate: true,
};

/// AdbGPT's actions, its action primitives as its public code lists them (sidongfeng/AdbGPT at
/// ec29b4b: `cfgs.ACTION_LISTS` and the prompt of `main.py`: tap, double tap, input, scroll, long
/// tap): tap (text fields too), long tap, input, and scroll of the whole screen up and down.
/// Double tap is left out: the device interface has none. There is no Back, Enter or rotation:
/// its replay presses Back only when no component matches a step, and retries the step; here
/// such a step is skipped. The AdbGPT paper is not in our paper set, so its code is the source
/// here.
pub const ADBGPT_RULES: ActionRules = ActionRules {
    click_text_fields: true,
    swipes: &[],
    keys: &[],
    screen_swipes: &[Direction::Up, Direction::Down],
    rotate: false,
};

/// The first line of ReBL's system prompt.
pub const REBL_MARKER: &str = "rebl stage: step";
/// The first line of AdbGPT's extraction system prompt.
pub const ADBGPT_EXTRACT_MARKER: &str = "adbgpt stage: extract";
/// The first line of AdbGPT's matching system prompt.
pub const ADBGPT_MATCH_MARKER: &str = "adbgpt stage: match";

/// What an agent sees of the screen before choosing an action.
struct Screen {
    activity: String,
    widgets: Vec<String>,
    candidates: Vec<Action>,
}

async fn observe(dev: &dyn Device, rules: &ActionRules) -> Result<Screen, DeviceError> {
    let h = dev.hierarchy().await?;
    Ok(Screen {
        activity: dev.current_activity().await?,
        widgets: widget_lines(&h),
        candidates: enumerate_with(&h, rules),
    })
}

/// The screen in prompt form: activity, widget list, numbered candidate actions.
fn screen_text(s: &Screen) -> String {
    let mut out = format!(
        "Current activity: {}\n\nWidgets on the screen:\n",
        s.activity
    );
    if s.widgets.is_empty() {
        out.push_str("  (none)\n");
    }
    for w in &s.widgets {
        out.push_str(&format!("  {w}\n"));
    }
    out.push_str("\nCandidate actions:\n");
    for (i, a) in s.candidates.iter().enumerate() {
        out.push_str(&format!("  [{i}] {}\n", describe_action(a)));
    }
    out
}

/// `a` with `text` typed when it is a text input (other actions are returned as they are).
fn with_text(a: &Action, text: Option<&str>) -> Action {
    match (a, text) {
        (Action::InputText { target, .. }, Some(t)) => Action::InputText {
            target: target.clone(),
            text: t.to_string(),
        },
        _ => a.clone(),
    }
}

/// An integer field of an answer, also when written as a string.
fn int_field(v: &Value, field: &str) -> Option<i64> {
    let x = v.get(field)?;
    x.as_i64()
        .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
}

/// A non-empty string field of an answer.
fn str_field<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get(field)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// At most `n` characters of `s` (for feedback and logs).
fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// How executing one action ended.
enum Performed {
    /// The action ran (or was refused by the device); what happened, in words, and the screen
    /// after it.
    Done { feedback: String, after: Screen },
    /// The app crashed: the run is over.
    Crashed,
    /// A budget is spent: the run is over.
    Stopped,
}

/// Takes one action from the budget, performs `action`, checks the crash oracle and says what
/// changed on screen compared with `before` (the screen after it is observed under `rules`).
async fn perform(
    dev: &dyn Device,
    package: &str,
    meter: &Meter,
    action: &Action,
    before: &Screen,
    rules: &ActionRules,
    run: &mut AndroidRun,
) -> Result<Performed, AgentError> {
    if let Err(e) = meter.take_action() {
        run.exhausted = Some(e);
        return Ok(Performed::Stopped);
    }
    let refused = match dev.act(action).await {
        Ok(()) => {
            run.trace.push(action.clone());
            None
        }
        Err(DeviceError::Rejected(m)) => Some(m),
        Err(e) => return Err(e.into()),
    };
    if let Some(c) = dev.crash().await? {
        run.crash = Some(c);
        run.claimed = true;
        return Ok(Performed::Crashed);
    }
    let after = observe(dev, rules).await?;
    let feedback = if let Some(m) = refused {
        format!(
            "The action could not be performed (the widget is no longer on the screen?): {m}. \
             Nothing was done."
        )
    } else if !after.activity.starts_with(package) {
        format!(
            "The app is no longer in the foreground (the foreground activity is now {}).",
            after.activity
        )
    } else if after.activity != before.activity {
        format!(
            "The activity changed from {} to {}.",
            before.activity, after.activity
        )
    } else if after.widgets != before.widgets {
        format!("The screen changed (still activity {}).", after.activity)
    } else {
        "Nothing on the screen changed.".to_string()
    };
    Ok(Performed::Done { feedback, after })
}

/// Sends `messages`; `Ok(None)` when the LLM budget is spent (recorded in `run`).
async fn chat<L: Llm>(
    llm: &mut L,
    messages: &[Value],
    run: &mut AndroidRun,
) -> Result<Option<String>, AgentError> {
    match llm.chat(messages, &[]).await {
        Ok(turn) => Ok(Some(turn.content.unwrap_or_default())),
        Err(LlmError::Budget(_)) => {
            run.exhausted = Some(Exhausted::Llm);
            Ok(None)
        }
        Err(LlmError::Failed(m)) => Err(AgentError::Llm(m)),
        Err(LlmError::ContextLength(m)) => Err(AgentError::ContextLength(m)),
    }
}

const REBL_SYSTEM: &str = "rebl stage: step\nYou are testing an Android app. Your job is to \
make the bug described in a user's bug report happen again on a real device, by operating the \
app one action at a time. The report may not list its steps explicitly: work out from the \
whole report what the user did, and use what the screen shows.\n\n\
At every step you get the current screen (activity, widgets, and numbered candidate actions) and \
feedback on what your previous action did. Answer with one JSON object and nothing else:\n\
- to perform an action: {\"thought\": \"<short reasoning>\", \"action\": <candidate number>, \
\"text\": \"<text to type, only for input actions>\"}\n\
- when the screen now shows the bug of the report: {\"thought\": \"...\", \"status\": \
\"reproduced\"}\n\
- when you cannot get any further: {\"thought\": \"...\", \"status\": \"give_up\"}\n\
If the app crashes, the run ends on its own.";

/// ReBL: feedback-driven reproduction from the whole report; `visual` (ReBL-visual) adds the screenshot to every step.
pub async fn rebl<L: Llm>(
    llm: &mut L,
    dev: &dyn Device,
    package: &str,
    report: &AndroidReport,
    visual: bool,
    meter: &Meter,
) -> Result<AndroidRun, AgentError> {
    let mut run = AndroidRun::default();
    let head = [
        json!({"role": "system", "content": REBL_SYSTEM}),
        json!({"role": "user", "content": format!("The bug report:\n\n{}", report_text(report))}),
    ];
    // Earlier steps as (user message without screenshot, answer) pairs, oldest first.
    let mut history: Vec<[Value; 2]> = Vec::new();
    dev.launch(package).await?;
    let mut screen = observe(dev, &REBL_RULES).await?;
    let mut feedback = "The app was just launched; no action yet.".to_string();
    let mut step = 0usize;
    loop {
        if let Err(e) = meter.check_time() {
            run.exhausted = Some(e);
            break;
        }
        step += 1;
        let text = format!(
            "Step {step}.\nFeedback on your previous answer: {feedback}\n\n{}\n\
             Which action next? Answer with the JSON object only.",
            screen_text(&screen)
        );
        let png = if visual {
            Some(dev.screenshot().await?)
        } else {
            None
        };
        let images: Vec<&[u8]> = png.iter().map(Vec::as_slice).collect();
        let mut messages: Vec<Value> = head.to_vec();
        messages.extend(history.iter().flatten().cloned());
        messages.push(user_message(&text, &images));
        let Some(answer) = chat(llm, &messages, &mut run).await? else {
            break;
        };
        // Only the current step carries a screenshot; earlier steps keep their text.
        history.push([
            user_message(&text, &[]),
            json!({"role": "assistant", "content": answer}),
        ]);
        if history.len() > REBL_HISTORY_STEPS {
            history.remove(0);
        }
        let mut entry = json!({"stage": "rebl_step", "step": step, "answer": clip(&answer, 500)});
        let Some(v) = parse_json_answer(&answer) else {
            feedback = format!(
                "your answer was not valid JSON: {}. Answer with one JSON object.",
                clip(&answer, 200)
            );
            entry["feedback"] = json!(feedback);
            run.log.push(entry);
            continue;
        };
        match str_field(&v, "status") {
            Some("reproduced") => {
                run.claimed = true;
                entry["status"] = json!("reproduced");
                run.log.push(entry);
                break;
            }
            Some("give_up") => {
                entry["status"] = json!("give_up");
                run.log.push(entry);
                break;
            }
            _ => {}
        }
        let index = int_field(&v, "action");
        entry["index"] = json!(index);
        let Some(chosen) = index
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| screen.candidates.get(i))
        else {
            feedback = format!(
                "your answer named no candidate action (\"action\" must be a number from 0 to \
                 {}): nothing was done.",
                screen.candidates.len().saturating_sub(1)
            );
            entry["feedback"] = json!(feedback);
            run.log.push(entry);
            continue;
        };
        let action = with_text(chosen, str_field(&v, "text"));
        entry["action"] = json!(describe_action(&action));
        match perform(dev, package, meter, &action, &screen, &REBL_RULES, &mut run).await? {
            Performed::Done { feedback: f, after } => {
                feedback = format!("you did `{}`. {f}", describe_action(&action));
                entry["feedback"] = json!(f);
                run.log.push(entry);
                screen = after;
            }
            Performed::Crashed => {
                entry["feedback"] = json!("the app crashed");
                entry["crash"] = json!(run.crash);
                run.log.push(entry);
                break;
            }
            Performed::Stopped => {
                entry["feedback"] = json!("not performed: budget spent");
                run.log.push(entry);
                break;
            }
        }
    }
    run.actions_executed = meter.used();
    Ok(run)
}

/// One steps-to-reproduce entity as AdbGPT extracts it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct S2rStep {
    action: String,
    component: String,
    input: String,
    direction: String,
}

impl S2rStep {
    /// A step from a JSON object with string fields (anything else is left empty).
    pub(crate) fn from_value(v: &Value) -> Option<S2rStep> {
        let field = |k: &str| match v.get(k) {
            Some(Value::String(s)) => s.trim().to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let step = S2rStep {
            action: field("action").to_lowercase(),
            component: field("component"),
            input: field("input"),
            direction: field("direction").to_lowercase(),
        };
        (!step.action.is_empty() || !step.component.is_empty()).then_some(step)
    }

    /// The step in words, e.g. `input "Stretch" into "habit name"`.
    pub(crate) fn words(&self) -> String {
        let mut out = if self.action.is_empty() {
            "tap".to_string()
        } else {
            self.action.clone()
        };
        if !self.input.is_empty() {
            out.push_str(&format!(" \"{}\" into", self.input));
        }
        if !self.direction.is_empty() {
            out.push_str(&format!(" {}", self.direction));
        }
        if !self.component.is_empty() {
            out.push_str(&format!(" \"{}\"", self.component));
        }
        out
    }
}

/// What to type for `step`: the matching answer's text, else the step's input (an input step
/// may clear a field with an empty one), else the default text.
fn typed_text(step: &S2rStep, answered: Option<&str>) -> String {
    match answered {
        Some(t) => t.to_string(),
        None if step.action == "input" || !step.input.is_empty() => step.input.clone(),
        None => DEFAULT_INPUT.to_string(),
    }
}

/// The extracted steps of an answer: `{"steps": [...]}` or a bare array; empty when unusable.
fn parse_steps(answer: &str) -> Vec<S2rStep> {
    let list = parse_json_answer(answer)
        .and_then(|v| v.get("steps").cloned())
        .or_else(|| {
            let t = answer.trim();
            let (a, b) = (t.find('[')?, t.rfind(']')?);
            serde_json::from_str::<Value>(t.get(a..=b)?).ok()
        });
    list.as_ref()
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(S2rStep::from_value).collect())
        .unwrap_or_default()
}

const ADBGPT_EXTRACT_SYSTEM: &str = "adbgpt stage: extract\nYou read Android bug reports and \
write down the steps to reproduce them as a list of entities. Each step has an action type (one \
of tap, long_tap, input, scroll), the component it acts on (as the report names it: a label, \
button text or description), the text typed (input steps only) and the direction (scroll steps \
only). Reports often leave steps implicit (\"after saving it\" implies tapping \
Save) or merge several into one sentence: split them and fill in the missing ones. Think step \
by step first, then give the JSON object.";

const ADBGPT_EXAMPLE: &str = "Example.\n\
Report: \"Title: Crash when renaming a folder\\n\\nWent to Folders, long pressed 'Work', picked \
Rename and cleared the name, then hit OK. App closed.\"\n\
Reasoning: The user opens the Folders screen (tap Folders), long-presses the folder Work, taps \
the Rename option, empties the name field (input of an empty text), and confirms with OK.\n\
Answer: {\"steps\": [\
{\"action\": \"tap\", \"component\": \"Folders\", \"input\": \"\", \"direction\": \"\"}, \
{\"action\": \"long_tap\", \"component\": \"Work\", \"input\": \"\", \"direction\": \"\"}, \
{\"action\": \"tap\", \"component\": \"Rename\", \"input\": \"\", \"direction\": \"\"}, \
{\"action\": \"input\", \"component\": \"folder name\", \"input\": \"\", \"direction\": \"\"}, \
{\"action\": \"tap\", \"component\": \"OK\", \"input\": \"\", \"direction\": \"\"}]}";

const ADBGPT_MATCH_SYSTEM: &str = "adbgpt stage: match\nYou replay steps to reproduce on an \
Android app. Given one step and the current screen with its numbered candidate actions, pick \
the candidate that performs the step. Answer with one JSON object: {\"index\": <candidate \
number>, \"text\": \"<text to type, input steps only>\"}, or {\"index\": -1} when no \
candidate performs the step.";

/// AdbGPT: extracts steps-to-reproduce entities from the report, then matches each step to a widget of the current screen.
pub async fn adbgpt<L: Llm>(
    llm: &mut L,
    dev: &dyn Device,
    package: &str,
    report: &AndroidReport,
    meter: &Meter,
) -> Result<AndroidRun, AgentError> {
    let mut run = AndroidRun::default();
    if let Err(e) = meter.check_time() {
        run.exhausted = Some(e);
        return Ok(run);
    }
    // Phase 1: steps-to-reproduce entities.
    let prompt = format!(
        "{ADBGPT_EXAMPLE}\n\nNow this report.\nReport: \"{}\"\nReasoning:",
        report_text(report)
    );
    let messages = [
        json!({"role": "system", "content": ADBGPT_EXTRACT_SYSTEM}),
        user_message(&prompt, &[]),
    ];
    let Some(answer) = chat(llm, &messages, &mut run).await? else {
        run.actions_executed = meter.used();
        return Ok(run);
    };
    let steps = parse_steps(&answer);
    run.log.push(json!({
        "stage": "extract",
        "answer": clip(&answer, 2000),
        "steps": steps,
    }));
    if steps.is_empty() {
        run.actions_executed = meter.used();
        return Ok(run);
    }
    // Phase 2: guided replay, one matching call per step.
    dev.launch(package).await?;
    let mut screen = observe(dev, &ADBGPT_RULES).await?;
    let mut done: Vec<String> = Vec::new();
    let mut reached_end = true;
    for (i, step) in steps.iter().enumerate() {
        if let Err(e) = meter.check_time() {
            run.exhausted = Some(e);
            reached_end = false;
            break;
        }
        let earlier = if done.is_empty() {
            "none".to_string()
        } else {
            done.join("; ")
        };
        let prompt = format!(
            "Steps already replayed: {earlier}.\nStep {} of {}: {}\n\n{}\n\
             Which candidate performs this step? Answer with the JSON object only.",
            i + 1,
            steps.len(),
            step.words(),
            screen_text(&screen)
        );
        let messages = [
            json!({"role": "system", "content": ADBGPT_MATCH_SYSTEM}),
            user_message(&prompt, &[]),
        ];
        let Some(answer) = chat(llm, &messages, &mut run).await? else {
            reached_end = false;
            break;
        };
        let mut entry = json!({
            "stage": "match",
            "step": i + 1,
            "s2r": step,
            "answer": clip(&answer, 500),
        });
        let index = parse_json_answer(&answer).and_then(|v| {
            let i = int_field(&v, "index")?;
            Some((i, v.get("text").and_then(Value::as_str).map(str::to_string)))
        });
        entry["index"] = json!(index.as_ref().map(|(i, _)| *i));
        let chosen = index.as_ref().and_then(|(i, text)| {
            let a = screen.candidates.get(usize::try_from(*i).ok()?)?;
            Some(with_text(a, Some(&typed_text(step, text.as_deref()))))
        });
        let Some(action) = chosen else {
            entry["feedback"] = json!(match index {
                Some((-1, _)) => "no candidate performs the step: skipped",
                _ => "unusable answer: step skipped",
            });
            run.log.push(entry);
            continue;
        };
        entry["action"] = json!(describe_action(&action));
        match perform(
            dev,
            package,
            meter,
            &action,
            &screen,
            &ADBGPT_RULES,
            &mut run,
        )
        .await?
        {
            Performed::Done { feedback, after } => {
                entry["feedback"] = json!(feedback);
                run.log.push(entry);
                done.push(step.words());
                screen = after;
            }
            Performed::Crashed => {
                entry["feedback"] = json!("the app crashed");
                entry["crash"] = json!(run.crash);
                run.log.push(entry);
                break;
            }
            Performed::Stopped => {
                entry["feedback"] = json!("not performed: budget spent");
                run.log.push(entry);
                reached_end = false;
                break;
            }
        }
    }
    run.claimed = run.crash.is_some() || (reached_end && !run.trace.is_empty());
    run.actions_executed = meter.used();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::{ScriptedLlm, message_text, same_action};
    use crate::sim::{Dataset, SimDevice, SimLatency, SimReport, replay, source_dataset_dir};
    use base64::Engine;
    use futures_util::FutureExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    type Answer = Box<dyn Fn(&[Value]) -> Result<String, LlmError> + Send + Sync>;

    fn setup(id: &str) -> (Dataset, Arc<SimDevice>, String, SimReport) {
        let ds = Dataset::load(&source_dataset_dir()).expect("dataset loads");
        let (dev, package) = ds.device_for(id, SimLatency::ZERO).expect("report exists");
        let report = ds.reports[id].clone();
        (ds, Arc::new(dev), package, report)
    }

    fn meter(actions: usize) -> Meter {
        Meter::new(actions, Duration::from_secs(60))
    }

    /// Whether `trace` reproduces report `id` when replayed on a fresh device.
    async fn reproduces(ds: &Dataset, id: &str, trace: &[Action]) -> bool {
        let (dev, package) = ds.device_for(id, SimLatency::ZERO).expect("device");
        let (h, crash) = replay(&dev, &package, trace).await.expect("replay");
        ds.reports[id].reproduced(&h, crash.as_ref())
    }

    fn typed(a: &Action) -> Option<&str> {
        match a {
            Action::InputText { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The number of the current screen's candidate under `rules` that does what `gold` does
    /// (for inputs: the same field), or -1.
    fn candidate_for(dev: &SimDevice, rules: &ActionRules, gold: &Action) -> i64 {
        let h = dev
            .hierarchy()
            .now_or_never()
            .expect("the sim answers at once")
            .expect("hierarchy");
        enumerate_with(&h, rules)
            .iter()
            .position(|c| same_action(&with_text(c, typed(gold)), gold))
            .map_or(-1, |i| i as i64)
    }

    /// A scripted ReBL policy: the candidate matching the next ground-truth action, then
    /// "reproduced" once the ground truth is done.
    fn rebl_follower(dev: Arc<SimDevice>, gold: Vec<Action>) -> Answer {
        let next = AtomicUsize::new(0);
        Box::new(move |_| {
            let i = next.fetch_add(1, Ordering::SeqCst);
            Ok(match gold.get(i) {
                Some(g) => json!({
                    "thought": "the report's next step",
                    "action": candidate_for(&dev, &REBL_RULES, g),
                    "text": typed(g),
                })
                .to_string(),
                None => json!({"thought": "the bug shows", "status": "reproduced"}).to_string(),
            })
        })
    }

    fn scripted(answer: Answer) -> ScriptedLlm {
        ScriptedLlm::new(answer)
    }

    /// The image parts of every message: (message index, data URL).
    fn image_urls(messages: &[Value]) -> Vec<(usize, String)> {
        let mut out = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            for p in m["content"].as_array().into_iter().flatten() {
                if p["type"] == "image_url" {
                    out.push((i, p["image_url"]["url"].as_str().unwrap_or("").to_string()));
                }
            }
        }
        out
    }

    /// Each baseline names its agent and stage on its system prompts' first line and offers
    /// its own method's actions: ReBL clicks text fields, swipes the screen four ways, presses
    /// Back and rotates, but has no Enter; AdbGPT taps, types and scrolls the screen up and
    /// down only.
    #[tokio::test]
    async fn each_baseline_offers_its_methods_actions_and_names_its_stage() {
        for (prompt, marker) in [
            (REBL_SYSTEM, REBL_MARKER),
            (ADBGPT_EXTRACT_SYSTEM, ADBGPT_EXTRACT_MARKER),
            (ADBGPT_MATCH_SYSTEM, ADBGPT_MATCH_MARKER),
        ] {
            assert_eq!(prompt.lines().next(), Some(marker));
        }
        let (_, dev, package, _) = setup("skycast-11");
        dev.launch(&package).await.unwrap();
        let h = dev.hierarchy().await.unwrap();
        let words = |rules: &ActionRules| -> Vec<String> {
            enumerate_with(&h, rules)
                .iter()
                .map(describe_action)
                .collect()
        };
        let has = |words: &[String], w: &str| words.iter().any(|x| x == w);
        let field = "click <EditText resource-id=\"search_city\"/>";
        let rebl = words(&REBL_RULES);
        for w in [
            field,
            "swipe left on the screen",
            "press back",
            "rotate the screen",
        ] {
            assert!(has(&rebl, w), "ReBL lacks {w}: {rebl:?}");
        }
        assert!(!has(&rebl, "press enter"));
        let adbgpt = words(&ADBGPT_RULES);
        for w in [field, "swipe up on the screen", "swipe down on the screen"] {
            assert!(has(&adbgpt, w), "AdbGPT lacks {w}: {adbgpt:?}");
        }
        assert!(
            adbgpt
                .iter()
                .any(|w| w.starts_with("input \"test\" in <EditText"))
        );
        for w in [
            "press back",
            "press enter",
            "rotate the screen",
            "swipe left on the screen",
        ] {
            assert!(!has(&adbgpt, w), "AdbGPT offers {w}");
        }
    }

    #[tokio::test]
    async fn rebl_following_the_ground_truth_reproduces_a_twelve_step_crash() {
        let id = "pocketbudget-09";
        let (ds, dev, package, report) = setup(id);
        assert!(report.ground_truth.len() >= 5);
        let prompts = Arc::new(Mutex::new(Vec::<Vec<Value>>::new()));
        let follow = rebl_follower(dev.clone(), report.ground_truth.clone());
        let seen = prompts.clone();
        let mut llm = scripted(Box::new(move |m| {
            seen.lock().unwrap().push(m.to_vec());
            follow(m)
        }));
        let m = meter(50);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.trace.len(), report.ground_truth.len());
        assert!(run.claimed && run.crash.is_some() && run.exhausted.is_none());
        assert_eq!(run.actions_executed, report.ground_truth.len());
        assert!(report.reproduced(&dev.hierarchy().await.unwrap(), run.crash.as_ref()));
        assert!(reproduces(&ds, id, &run.trace).await);
        assert_eq!(run.log.len(), report.ground_truth.len());
        // The whole report is in every prompt, with feedback on the previous action.
        let prompts = prompts.lock().unwrap();
        assert_eq!(prompts.len(), report.ground_truth.len());
        for p in prompts.iter() {
            assert!(
                p.iter()
                    .any(|m| message_text(m).contains(report.title.trim()))
            );
        }
        let last = message_text(prompts[1].last().unwrap());
        assert!(
            last.contains("Feedback on your previous answer: you did `click"),
            "{last}"
        );
        assert!(last.contains("Candidate actions:\n  [0] "), "{last}");
        // History: system, report, then (user, answer) per earlier step.
        assert_eq!(prompts[3].len(), 2 + 2 * 3 + 1);
    }

    #[tokio::test]
    async fn rebl_claims_a_non_crash_bug_when_the_policy_says_reproduced() {
        let id = "habitflow-08";
        let (ds, dev, package, report) = setup(id);
        let mut llm = scripted(rebl_follower(dev.clone(), report.ground_truth.clone()));
        let m = meter(50);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert!(run.claimed && run.crash.is_none() && run.exhausted.is_none());
        assert_eq!(run.trace.len(), 6);
        assert_eq!(llm.calls(), 7);
        assert_eq!(run.log.last().unwrap()["status"], "reproduced");
        assert!(report.reproduced(&dev.hierarchy().await.unwrap(), None));
        assert!(reproduces(&ds, id, &run.trace).await);
    }

    #[tokio::test]
    async fn the_history_is_capped() {
        let (_, dev, package, report) = setup("habitflow-08");
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let seen = sizes.clone();
        // Rotating forever: 20 actions, then the action budget ends the run.
        let mut llm = scripted(Box::new(move |m| {
            seen.lock().unwrap().push(m.len());
            Ok(r#"{"action": 999999}"#.replace("999999", &rotate_index(m)))
        }));
        let m = meter(20);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Actions));
        let sizes = sizes.lock().unwrap();
        assert_eq!(sizes.len(), 21);
        assert_eq!(*sizes.iter().max().unwrap(), 2 + 2 * REBL_HISTORY_STEPS + 1);
    }

    /// The number of the "rotate the screen" candidate in the last prompt.
    fn rotate_index(m: &[Value]) -> String {
        let text = message_text(m.last().unwrap());
        let line = text
            .lines()
            .find(|l| l.ends_with("rotate the screen"))
            .expect("rotate is offered");
        line.trim()
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn rebl_visual_adds_one_screenshot_per_step_and_plain_rebl_none() {
        for visual in [false, true] {
            let (_, dev, package, report) = setup("habitflow-08");
            let images = Arc::new(Mutex::new(Vec::new()));
            let seen = images.clone();
            let follow = rebl_follower(dev.clone(), report.ground_truth.clone());
            let mut llm = scripted(Box::new(move |m| {
                seen.lock().unwrap().push((m.len(), image_urls(m)));
                follow(m)
            }));
            let m = meter(50);
            let run = rebl(
                &mut llm,
                &*dev,
                &package,
                &report.android_report(),
                visual,
                &m,
            )
            .await
            .expect("run");
            assert!(run.claimed);
            let images = images.lock().unwrap();
            assert_eq!(images.len(), 7);
            for (len, urls) in images.iter() {
                if !visual {
                    assert!(urls.is_empty());
                    continue;
                }
                // One PNG, in the step's own (last) message.
                assert_eq!(urls.len(), 1);
                assert_eq!(urls[0].0, len - 1);
                let b64 = urls[0].1.strip_prefix("data:image/png;base64,").unwrap();
                let png = base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap();
                assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
            }
        }
    }

    /// How a scripted extraction names the widget of `a`.
    fn component(a: &Action) -> String {
        let w = match a {
            Action::Click { target }
            | Action::LongClick { target }
            | Action::InputText { target, .. } => target,
            _ => return String::new(),
        };
        if !w.text.is_empty() {
            w.text.clone()
        } else if !w.content_desc.is_empty() {
            w.content_desc.clone()
        } else {
            w.resource_id.rsplit("/").next().unwrap().replace('_', " ")
        }
    }

    fn gold_steps(gold: &[Action]) -> Vec<Value> {
        gold.iter()
            .map(|a| {
                let kind = match a {
                    Action::Click { .. } => "tap",
                    Action::LongClick { .. } => "long_tap",
                    Action::InputText { .. } => "input",
                    Action::Swipe { .. } => "swipe",
                    Action::Rotate => "rotate",
                    Action::Press { .. } => "back",
                };
                json!({"action": kind, "component": component(a),
                       "input": typed(a).unwrap_or(""), "direction": ""})
            })
            .collect()
    }

    /// A scripted AdbGPT: the gold steps (plus a step about a settings gear that exists nowhere)
    /// as extraction, then the matching candidate for each gold step and -1 for the gear.
    fn adbgpt_follower(dev: Arc<SimDevice>, gold: Vec<Action>) -> Answer {
        let mut steps = gold_steps(&gold);
        steps.insert(
            2,
            json!({"action": "tap", "component": "Settings gear", "input": "", "direction": ""}),
        );
        let extraction = format!(
            "The user adds a habit, names it, saves, opens it and checks in twice.\nAnswer: {}",
            json!({ "steps": steps })
        );
        let calls = AtomicUsize::new(0);
        let next = AtomicUsize::new(0);
        Box::new(move |m| {
            if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                return Ok(extraction.clone());
            }
            if message_text(m.last().unwrap()).contains("\"Settings gear\"") {
                return Ok(r#"{"index": -1}"#.into());
            }
            let g = &gold[next.fetch_add(1, Ordering::SeqCst)];
            Ok(json!({ "index": candidate_for(&dev, &ADBGPT_RULES, g) }).to_string())
        })
    }

    #[tokio::test]
    async fn adbgpt_replays_extracted_steps_and_skips_one_that_matches_nothing() {
        let id = "habitflow-08";
        let (ds, dev, package, report) = setup(id);
        let prompts = Arc::new(Mutex::new(Vec::new()));
        let seen = prompts.clone();
        let follow = adbgpt_follower(dev.clone(), report.ground_truth.clone());
        let mut llm = scripted(Box::new(move |m| {
            seen.lock()
                .unwrap()
                .push(m.iter().map(message_text).collect::<Vec<_>>().join("\n"));
            follow(m)
        }));
        let m = meter(50);
        let run = adbgpt(&mut llm, &*dev, &package, &report.android_report(), &m)
            .await
            .expect("run");
        assert_eq!(llm.calls(), 1 + 7);
        assert_eq!(run.trace.len(), 6);
        assert!(run.claimed && run.exhausted.is_none() && run.crash.is_none());
        assert_eq!(run.actions_executed, 6);
        // The typed text comes from the extracted step.
        assert_eq!(typed(&run.trace[1]), Some("Stretch"));
        assert!(reproduces(&ds, id, &run.trace).await);
        assert_eq!(run.log[0]["stage"], "extract");
        assert_eq!(run.log[0]["steps"].as_array().unwrap().len(), 7);
        assert_eq!(run.log[3]["index"], -1);
        assert!(run.log[3].get("action").is_none());
        let prompts = prompts.lock().unwrap();
        assert!(prompts[0].contains(report.body.trim()));
        assert!(prompts[2].contains("input \"Stretch\" into \"habit name input\""));
    }

    #[tokio::test]
    async fn adbgpt_reproduces_a_crash() {
        let id = "pocketbudget-09";
        let (ds, dev, package, report) = setup(id);
        let gold = report.ground_truth.clone();
        let extraction = json!({ "steps": gold_steps(&gold) }).to_string();
        let calls = AtomicUsize::new(0);
        let d = dev.clone();
        let mut llm = ScriptedLlm::new(move |_| {
            let i = calls.fetch_add(1, Ordering::SeqCst);
            Ok(if i == 0 {
                extraction.clone()
            } else {
                let g = &gold[i - 1];
                json!({"index": candidate_for(&d, &ADBGPT_RULES, g), "text": typed(g)}).to_string()
            })
        });
        let m = meter(50);
        let run = adbgpt(&mut llm, &*dev, &package, &report.android_report(), &m)
            .await
            .expect("run");
        assert!(run.claimed && run.crash.is_some());
        assert!(reproduces(&ds, id, &run.trace).await);
    }

    #[tokio::test]
    async fn the_action_budget_stops_both_agents() {
        let (_, dev, package, report) = setup("pocketbudget-09");
        let mut llm = scripted(rebl_follower(dev.clone(), report.ground_truth.clone()));
        let m = meter(3);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            true,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Actions));
        assert_eq!((run.trace.len(), run.actions_executed), (3, 3));
        assert!(!run.claimed);

        let (_, dev, package, report) = setup("habitflow-08");
        let mut llm = scripted(adbgpt_follower(dev.clone(), report.ground_truth.clone()));
        let m = meter(3);
        let run = adbgpt(&mut llm, &*dev, &package, &report.android_report(), &m)
            .await
            .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Actions));
        assert_eq!((run.trace.len(), run.actions_executed), (3, 3));
        assert!(!run.claimed);
    }

    #[tokio::test]
    async fn an_llm_budget_error_ends_the_run() {
        let (_, dev, package, report) = setup("pocketbudget-09");
        let follow = rebl_follower(dev.clone(), report.ground_truth.clone());
        let calls = AtomicUsize::new(0);
        let mut llm = scripted(Box::new(move |m| {
            if calls.fetch_add(1, Ordering::SeqCst) >= 2 {
                return Err(LlmError::Budget("calls".into()));
            }
            follow(m)
        }));
        let m = meter(50);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Llm));
        assert_eq!(run.trace.len(), 2);
        assert!(!run.claimed);

        for budget_at in [0, 3] {
            let (_, dev, package, report) = setup("habitflow-08");
            let follow = adbgpt_follower(dev.clone(), report.ground_truth.clone());
            let calls = AtomicUsize::new(0);
            let mut llm = scripted(Box::new(move |m| {
                if calls.fetch_add(1, Ordering::SeqCst) >= budget_at {
                    return Err(LlmError::Budget("tokens".into()));
                }
                follow(m)
            }));
            let m = meter(50);
            let run = adbgpt(&mut llm, &*dev, &package, &report.android_report(), &m)
                .await
                .expect("run");
            assert_eq!(run.exhausted, Some(Exhausted::Llm));
            assert_eq!(run.trace.len(), budget_at.saturating_sub(1));
            assert!(!run.claimed);
        }

        // A failed call is an error.
        let mut llm = ScriptedLlm::new(|_| Err(LlmError::Failed("HTTP 500".into())));
        let err = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &meter(5),
        )
        .await
        .unwrap_err();
        assert_eq!(err, AgentError::Llm("HTTP 500".into()));

        // A prompt the model refuses as too long ends the run as that, not as a failed call.
        let mut llm =
            ScriptedLlm::new(|_| Err(LlmError::ContextLength("2048 tokens at most".into())));
        let err = adbgpt(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            &meter(5),
        )
        .await
        .unwrap_err();
        assert_eq!(err, AgentError::ContextLength("2048 tokens at most".into()));
    }

    #[tokio::test]
    async fn garbage_answers_waste_steps_until_a_budget_ends_the_run() {
        let (_, dev, package, report) = setup("pocketbudget-09");
        let prompts = Arc::new(Mutex::new(Vec::new()));
        let seen = prompts.clone();
        let calls = AtomicUsize::new(0);
        let mut llm = scripted(Box::new(move |m| {
            seen.lock().unwrap().push(message_text(m.last().unwrap()));
            if calls.fetch_add(1, Ordering::SeqCst) >= 6 {
                return Err(LlmError::Budget("calls".into()));
            }
            Ok("I would tap the Save button { maybe".into())
        }));
        let m = meter(50);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Llm));
        assert!(run.trace.is_empty() && !run.claimed);
        assert_eq!(run.log.len(), 6);
        assert!(prompts.lock().unwrap()[1].contains("your answer was not valid JSON: I would tap"));

        // Garbage, an index out of range and a valid pick in turn: only the pick acts.
        let (_, dev, package, report) = setup("pocketbudget-09");
        let calls = AtomicUsize::new(0);
        let mut llm = ScriptedLlm::new(move |m| {
            Ok(match calls.fetch_add(1, Ordering::SeqCst) % 3 {
                0 => "no idea".to_string(),
                1 => r#"{"action": 4242}"#.to_string(),
                _ => format!(r#"{{"action": {}}}"#, rotate_index(m)),
            })
        });
        let m = meter(2);
        let run = rebl(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            false,
            &m,
        )
        .await
        .expect("run");
        assert_eq!(run.exhausted, Some(Exhausted::Actions));
        assert_eq!(run.trace, [Action::Rotate, Action::Rotate]);
        assert_eq!(llm.calls(), 9);

        // AdbGPT: an unusable extraction is an empty step list; unusable matches are skipped.
        let (_, dev, package, report) = setup("habitflow-08");
        let mut llm = ScriptedLlm::new(|_| Ok("Sorry, I cannot read this report.".into()));
        let run = adbgpt(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            &meter(5),
        )
        .await
        .expect("run");
        assert!(run.trace.is_empty() && !run.claimed && run.exhausted.is_none());
        assert_eq!(run.log[0]["steps"], json!([]));
        let steps = json!({ "steps": gold_steps(&report.ground_truth) }).to_string();
        let calls = AtomicUsize::new(0);
        let mut llm = ScriptedLlm::new(move |_| {
            Ok(match calls.fetch_add(1, Ordering::SeqCst) {
                0 => steps.clone(),
                1 => r#"{"index": 77}"#.into(),
                _ => "tap it".into(),
            })
        });
        let run = adbgpt(
            &mut llm,
            &*dev,
            &package,
            &report.android_report(),
            &meter(5),
        )
        .await
        .expect("run");
        assert!(run.trace.is_empty() && !run.claimed && run.exhausted.is_none());
        assert_eq!(llm.calls(), 1 + report.ground_truth.len());
    }
}
