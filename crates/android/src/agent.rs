//! What every LLM agent of the android track shares: the report as prompt text, the action and
//! time budget, how actions and widgets are put into words, screenshots as image parts of a chat
//! message, lenient reading of the model's JSON answers, and what a run returns.

use super::device::{Action, Crash, Direction, Hierarchy, Key, Widget, WidgetRef};
use base64::Engine;
use reprobench_domain::android::AndroidReport;
use reprobench_gateway::llm::{AssistantTurn, Llm, LlmError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The report as plain text: title, body and comments, as LTGDroid puts it in a prompt.
pub fn report_text(r: &AndroidReport) -> String {
    let mut out = format!("Title: {}\n\n{}", r.title.trim(), r.body.trim());
    for (i, c) in r.comments.iter().enumerate() {
        out.push_str(&format!("\n\nComment {}: {}", i + 1, c.trim()));
    }
    out
}

/// Why a run stopped before its agent was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exhausted {
    /// The UI action budget is spent.
    Actions,
    /// The wall-clock budget is spent.
    Time,
    /// The LLM budget (calls, tokens, cost) is spent.
    Llm,
}

/// The UI action and wall-clock budget of one run, shared by every device replica it uses.
#[derive(Debug)]
pub struct Meter {
    used: AtomicUsize,
    max_actions: usize,
    deadline: Instant,
}

impl Meter {
    /// A budget of `max_actions` UI actions and `max_time` from now.
    pub fn new(max_actions: usize, max_time: Duration) -> Meter {
        Meter {
            used: AtomicUsize::new(0),
            max_actions,
            deadline: Instant::now() + max_time,
        }
    }

    /// Takes one action from the budget, or says which budget is spent.
    pub fn take_action(&self) -> Result<(), Exhausted> {
        self.check_time()?;
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u < self.max_actions).then_some(u + 1)
            })
            .map(|_| ())
            .map_err(|_| Exhausted::Actions)
    }

    /// Fails once the deadline has passed.
    pub fn check_time(&self) -> Result<(), Exhausted> {
        if Instant::now() >= self.deadline {
            Err(Exhausted::Time)
        } else {
            Ok(())
        }
    }

    /// UI actions taken so far.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Actions left.
    pub fn actions_left(&self) -> usize {
        self.max_actions.saturating_sub(self.used())
    }
}

/// Why an android agent could not finish its run (budgets are not errors: they end the run).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AgentError {
    /// The device failed (the attempt is retried elsewhere).
    #[error(transparent)]
    Device(#[from] super::device::DeviceError),
    /// An LLM call failed after the gateway's retries.
    #[error("LLM call failed: {0}")]
    Llm(String),
    /// The model refused a prompt as longer than its context window (final, not retried).
    #[error("the prompt exceeds the model's context window: {0}")]
    ContextLength(String),
}

/// What an android agent's run returns; the executor grades it by replaying `trace` on a fresh
/// device of the same app.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AndroidRun {
    /// The trace the agent offers as the reproduction, from app start.
    pub trace: Vec<Action>,
    /// UI actions executed in total, on every replica (exploration included).
    pub actions_executed: usize,
    /// Whether the agent concluded that `trace` reproduces the bug.
    pub claimed: bool,
    /// The budget that stopped the run, if one did.
    pub exhausted: Option<Exhausted>,
    /// The crash seen at the end of `trace` during the run, if any.
    pub crash: Option<Crash>,
    /// Agent-specific record (steps, paths, verdicts) for the attempt's artifacts.
    pub log: Vec<Value>,
}

/// A widget in LTGDroid's XML-like form, e.g. `<EditText resource-id="name" text="Enter Name"/>`.
pub fn describe_widget(w: &WidgetRef) -> String {
    let class = w.class.rsplit('.').next().unwrap_or("View");
    let class = if class.is_empty() { "View" } else { class };
    let mut out = format!("<{class}");
    let id = w
        .resource_id
        .rsplit_once(":id/")
        .map_or(w.resource_id.as_str(), |(_, s)| s);
    for (k, v) in [
        ("resource-id", id),
        ("text", w.text.as_str()),
        ("content-desc", w.content_desc.as_str()),
    ] {
        if !v.is_empty() {
            out.push_str(&format!(" {k}=\"{}\"", v.replace('"', "'")));
        }
    }
    out.push_str("/>");
    out
}

/// An action in words, e.g. `click <Button text="Save"/>` or `input "Wallet" in <EditText …/>`.
pub fn describe_action(a: &Action) -> String {
    match a {
        Action::Click { target } => format!("click {}", describe_widget(target)),
        Action::LongClick { target } => format!("long-click {}", describe_widget(target)),
        Action::InputText { target, text } => {
            format!("input \"{text}\" in {}", describe_widget(target))
        }
        Action::Press { key } => format!("press {}", key_name(*key)),
        Action::Swipe { direction, target } => {
            let on = target
                .as_ref()
                .map_or("the screen".to_string(), describe_widget);
            format!("swipe {} on {on}", direction_name(*direction))
        }
        Action::Rotate => "rotate the screen".to_string(),
    }
}

fn key_name(k: Key) -> &'static str {
    match k {
        Key::Back => "back",
        Key::Enter => "enter",
        Key::Delete => "delete",
        Key::Home => "home",
    }
}

fn direction_name(d: Direction) -> &'static str {
    match d {
        Direction::Up => "up",
        Direction::Down => "down",
        Direction::Left => "left",
        Direction::Right => "right",
    }
}

/// Whether two actions do the same thing: same kind, key or direction, typed text, and a target
/// naming the same widget (resource id, else text, else content-desc). Bounds are ignored.
pub fn same_action(a: &Action, b: &Action) -> bool {
    let same_widget = |x: &WidgetRef, y: &WidgetRef| {
        if !x.resource_id.is_empty() || !y.resource_id.is_empty() {
            x.resource_id == y.resource_id
                && (x.text.is_empty() || y.text.is_empty() || x.text == y.text)
        } else if !x.text.is_empty() || !y.text.is_empty() {
            x.text == y.text
        } else {
            x.content_desc == y.content_desc
        }
    };
    match (a, b) {
        (Action::Click { target: x }, Action::Click { target: y })
        | (Action::LongClick { target: x }, Action::LongClick { target: y }) => same_widget(x, y),
        (Action::InputText { target: x, text: s }, Action::InputText { target: y, text: t }) => {
            same_widget(x, y) && s == t
        }
        (Action::Press { key: x }, Action::Press { key: y }) => x == y,
        (
            Action::Swipe {
                direction: d,
                target: x,
            },
            Action::Swipe {
                direction: e,
                target: y,
            },
        ) => {
            d == e
                && match (x, y) {
                    (Some(x), Some(y)) => same_widget(x, y),
                    (None, None) => true,
                    _ => false,
                }
        }
        (Action::Rotate, Action::Rotate) => true,
        _ => false,
    }
}

/// The screen's widgets that show something or accept input, one per line in the XML-like form
/// (what prompts call the widget list).
pub fn widget_lines(h: &Hierarchy) -> Vec<String> {
    let shown = |w: &&Widget| {
        !w.text.is_empty()
            || !w.content_desc.is_empty()
            || !w.hint.is_empty()
            || w.clickable
            || w.long_clickable
            || w.scrollable
            || w.is_text_field()
    };
    h.widgets()
        .into_iter()
        .filter(shown)
        .map(|w| {
            let mut line = describe_widget(&WidgetRef::of(w));
            if !w.hint.is_empty() {
                line.insert_str(line.len() - 2, &format!(" hint=\"{}\"", w.hint));
            }
            line
        })
        .collect()
}

/// A PNG as an OpenAI chat image part (`data:` URL).
pub fn image_part(png: &[u8]) -> Value {
    let b64 = base64::engine::general_purpose::STANDARD.encode(png);
    json!({"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{b64}")}})
}

/// A user message with text and, when given, screenshots after it.
pub fn user_message(text: &str, images: &[&[u8]]) -> Value {
    if images.is_empty() {
        return json!({"role": "user", "content": text});
    }
    let mut parts = vec![json!({"type": "text", "text": text})];
    parts.extend(images.iter().map(|png| image_part(png)));
    json!({"role": "user", "content": parts})
}

/// The first JSON object in a model's answer: the whole text, a fenced block, or the span from
/// the first `{` to its matching `}`.
pub fn parse_json_answer(text: &str) -> Option<Value> {
    let t = text.trim();
    if let Ok(v @ Value::Object(_)) = serde_json::from_str::<Value>(t) {
        return Some(v);
    }
    let bytes = t.as_bytes();
    let mut start = 0;
    while let Some(off) = t[start..].find('{') {
        let open = start + off;
        let (mut depth, mut in_str, mut escaped) = (0i32, false, false);
        for (i, &c) in bytes.iter().enumerate().skip(open) {
            if in_str {
                match c {
                    _ if escaped => escaped = false,
                    b'\\' => escaped = true,
                    b'"' => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        if let Ok(v @ Value::Object(_)) = serde_json::from_str(&t[open..=i]) {
                            return Some(v);
                        }
                        break;
                    }
                }
                _ => {}
            }
        }
        start = open + 1;
    }
    None
}

/// Integers in a JSON array field of an answer (`{"keep": [2, 0]}`), ignoring anything else.
pub fn index_list(v: &Value, field: &str) -> Vec<usize> {
    v.get(field)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| {
                    x.as_u64()
                        .or_else(|| x.as_str().and_then(|s| s.trim().parse().ok()))
                })
                .map(|x| x as usize)
                .collect()
        })
        .unwrap_or_default()
}

/// How a [`ScriptedLlm`] answers: a closure over the messages.
type ScriptedAnswer = dyn Fn(&[Value]) -> Result<String, LlmError> + Send + Sync;

/// An in-process [`Llm`] whose answers come from a Rust closure over the messages: for tests
/// and benchmarks. It is NOT a language model, and [`ScriptedLlm::calls`] counts its calls.
#[derive(Clone)]
pub struct ScriptedLlm {
    answer: std::sync::Arc<ScriptedAnswer>,
    calls: std::sync::Arc<AtomicUsize>,
}

impl ScriptedLlm {
    /// A scripted client answering with `answer(messages)`.
    pub fn new(
        answer: impl Fn(&[Value]) -> Result<String, LlmError> + Send + Sync + 'static,
    ) -> ScriptedLlm {
        ScriptedLlm {
            answer: std::sync::Arc::new(answer),
            calls: std::sync::Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Calls answered so far (shared by clones).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Llm for ScriptedLlm {
    async fn chat(
        &mut self,
        messages: &[Value],
        _tools: &[Value],
    ) -> Result<AssistantTurn, LlmError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        (self.answer)(messages).map(|text| AssistantTurn {
            content: Some(text),
            tool_calls: Vec::new(),
        })
    }
}

/// The text of a message (its string content, or its text parts joined).
pub fn message_text(m: &Value) -> String {
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Sends one user message (text and screenshots) after `system` and returns the answer's text.
pub async fn ask<L: Llm>(
    llm: &mut L,
    system: &str,
    text: &str,
    images: &[&[u8]],
) -> Result<String, LlmError> {
    let messages = [
        json!({"role": "system", "content": system}),
        user_message(text, images),
    ];
    let turn = llm.chat(&messages, &[]).await?;
    Ok(turn.content.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(id: &str) -> WidgetRef {
        WidgetRef {
            resource_id: format!("com.example:id/{id}"),
            class: "android.widget.EditText".into(),
            ..Default::default()
        }
    }

    #[test]
    fn actions_in_words() {
        let a = Action::InputText {
            target: field("name"),
            text: "Wallet".into(),
        };
        assert_eq!(
            describe_action(&a),
            "input \"Wallet\" in <EditText resource-id=\"name\"/>"
        );
        assert_eq!(
            describe_action(&Action::Swipe {
                direction: Direction::Left,
                target: None
            }),
            "swipe left on the screen"
        );
    }

    #[test]
    fn same_action_ignores_bounds_but_not_text() {
        let mut a = field("name");
        a.bounds.right = 50;
        let x = Action::InputText {
            target: a,
            text: "1".into(),
        };
        let y = Action::InputText {
            target: field("name"),
            text: "1".into(),
        };
        let z = Action::InputText {
            target: field("name"),
            text: "2".into(),
        };
        assert!(same_action(&x, &y));
        assert!(!same_action(&x, &z));
        assert!(!same_action(
            &Action::Rotate,
            &Action::Press { key: Key::Back }
        ));
    }

    #[test]
    fn json_answers_are_found_in_prose_and_fences() {
        let v =
            parse_json_answer("Sure.\n```json\n{\"keep\": [2, \"0\"], \"why\": \"a } b\"}\n```")
                .unwrap();
        assert_eq!(index_list(&v, "keep"), [2, 0]);
        assert_eq!(parse_json_answer("no json {here"), None);
        assert!(parse_json_answer("{bad} then {\"ok\": true}").is_some());
    }

    #[test]
    fn the_meter_stops_at_the_budget() {
        let m = Meter::new(2, Duration::from_secs(60));
        assert!(m.take_action().is_ok() && m.take_action().is_ok());
        assert_eq!(m.take_action(), Err(Exhausted::Actions));
        assert_eq!(m.used(), 2);
        let t = Meter::new(5, Duration::ZERO);
        assert_eq!(t.take_action(), Err(Exhausted::Time));
    }
}
