//! App models as data: screens of uiautomator-like widgets, state variables, transitions with
//! guards and effects, rotation handling, crash triggers and non-crash symptoms (JSON files).

use crate::device::Bounds;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// A state variable's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    /// A flag.
    Bool(bool),
    /// A whole number.
    Int(i64),
    /// A string.
    Str(String),
    /// A list of strings.
    List(Vec<String>),
}

impl Value {
    /// How the value shows in a widget's text.
    pub fn display(&self) -> String {
        match self {
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Str(s) => s.clone(),
            Value::List(l) => l.join(", "),
        }
    }

    /// The value with the same type, emptied (0, false, "", []).
    pub fn cleared(&self) -> Value {
        match self {
            Value::Bool(_) => Value::Bool(false),
            Value::Int(_) => Value::Int(0),
            Value::Str(_) => Value::Str(String::new()),
            Value::List(_) => Value::List(Vec::new()),
        }
    }

    fn is_empty(&self) -> bool {
        match self {
            Value::Bool(b) => !b,
            Value::Int(i) => *i == 0,
            Value::Str(s) => s.is_empty(),
            Value::List(l) => l.is_empty(),
        }
    }

    fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::List(l) => Some(l.len() as i64),
            Value::Str(s) => s.parse().ok(),
            Value::Bool(_) => None,
        }
    }
}

/// A comparison in a guard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Equal to `value`.
    Eq,
    /// Not equal to `value`.
    Ne,
    /// Greater than `value` (ints; list length).
    Gt,
    /// Less than `value` (ints; list length).
    Lt,
    /// Empty: 0, false, "" or [].
    Empty,
    /// Not empty.
    NonEmpty,
    /// The string contains `value`, or the list has it as an item.
    Contains,
    /// The string matches the regular expression `value`.
    Matches,
}

/// One condition on a variable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cond {
    /// The variable.
    pub var: String,
    /// The comparison.
    pub op: Op,
    /// The operand (unused by `empty` / `non_empty`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// All conditions must hold (an empty guard always holds).
pub type Guard = Vec<Cond>;

/// Variables by name.
pub type Vars = BTreeMap<String, Value>;

/// Whether `guard` holds over `vars` (unknown variables fail the condition).
pub fn holds(guard: &[Cond], vars: &Vars) -> bool {
    guard.iter().all(|c| {
        let Some(v) = vars.get(&c.var) else {
            return false;
        };
        match c.op {
            Op::Empty => v.is_empty(),
            Op::NonEmpty => !v.is_empty(),
            Op::Eq => c.value.as_ref() == Some(v),
            Op::Ne => c.value.as_ref() != Some(v),
            Op::Gt | Op::Lt => match (v.as_int(), c.value.as_ref().and_then(Value::as_int)) {
                (Some(a), Some(b)) => (c.op == Op::Gt && a > b) || (c.op == Op::Lt && a < b),
                _ => false,
            },
            Op::Contains => match (v, c.value.as_ref()) {
                (Value::Str(s), Some(Value::Str(n))) => s.contains(n.as_str()),
                (Value::List(l), Some(Value::Str(n))) => l.contains(n),
                _ => false,
            },
            Op::Matches => match (v, c.value.as_ref()) {
                (Value::Str(s), Some(Value::Str(re))) => {
                    regex::Regex::new(re).is_ok_and(|re| re.is_match(s))
                }
                _ => false,
            },
        }
    })
}

/// Expands `{var}` (the value), `{#var}` (list length) and `{$text}` (the acted-on widget's
/// text) in `template`.
pub fn expand(template: &str, vars: &Vars, target_text: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('}') else {
            out.push_str(&rest[start..]);
            return out;
        };
        let name = &rest[start + 1..start + len];
        if name == "$text" {
            out.push_str(target_text);
        } else if let Some(list) = name.strip_prefix('#') {
            let n = vars.get(list).and_then(Value::as_int).unwrap_or(0);
            out.push_str(&n.to_string());
        } else if let Some(v) = vars.get(name) {
            out.push_str(&v.display());
        } else {
            out.push_str(&rest[start..=start + len]);
        }
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    out
}

/// A text that replaces a widget's own text while its guard holds (e.g. a wrong value).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    /// When it applies.
    pub when: Guard,
    /// The text (a template).
    pub text: String,
}

/// One widget of a screen, with real uiautomator attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WidgetSpec {
    /// `class`, e.g. `android.widget.Button`.
    pub class: String,
    /// Short resource id (`save` becomes `<package>:id/save`); "" for none.
    pub id: String,
    /// Text template (`{var}`, `{#list}`).
    pub text: String,
    /// `content-desc`.
    pub content_desc: String,
    /// `hint`.
    pub hint: String,
    /// `[left, top, right, bottom]` in portrait pixels.
    pub bounds: [i32; 4],
    /// `clickable`.
    pub clickable: bool,
    /// `long-clickable`.
    pub long_clickable: bool,
    /// `checkable` (checked = the bound bool variable).
    pub checkable: bool,
    /// `scrollable`.
    pub scrollable: bool,
    /// `enabled` (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Variable this text field or checkbox is bound to.
    pub bind: Option<String>,
    /// List variable whose items show as children (one `item_id` row each).
    pub list: Option<String>,
    /// Short resource id of the list's rows.
    pub item_id: String,
    /// Rows visible at once (default 6).
    pub page: Option<usize>,
    /// Shown only while this guard holds.
    pub visible_when: Guard,
    /// Text overrides under guards (first match wins).
    pub variants: Vec<Variant>,
}

fn yes() -> bool {
    true
}

impl WidgetSpec {
    /// The device-side bounds.
    pub fn bounds(&self) -> Bounds {
        let [left, top, right, bottom] = self.bounds;
        Bounds {
            left,
            top,
            right,
            bottom,
        }
    }
}

/// One screen (an activity or dialog).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Screen {
    /// Screen name used by transitions.
    pub name: String,
    /// Activity class, e.g. `.MainActivity`.
    pub activity: String,
    /// Variables lost (reset to their initial value) when the screen is rotated.
    #[serde(default)]
    pub reset_on_rotate: Vec<String>,
    /// Widgets, in drawing order.
    pub widgets: Vec<WidgetSpec>,
}

/// What kind of action a transition or crash trigger reacts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum On {
    /// A tap.
    Click,
    /// A long press.
    LongClick,
    /// Text typed into a field.
    InputText,
    /// A swipe.
    Swipe,
    /// A rotation.
    Rotate,
    /// The back key.
    Back,
    /// The enter key.
    Enter,
}

/// A state change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case")]
pub enum Effect {
    /// Sets a variable (string values are templates).
    Set {
        /// The variable.
        var: String,
        /// The new value.
        value: Value,
    },
    /// Adds to an int variable.
    Add {
        /// The variable.
        var: String,
        /// The amount (may be negative).
        by: i64,
    },
    /// Appends an item (a template) to a list.
    Append {
        /// The list.
        var: String,
        /// The item.
        value: String,
    },
    /// Removes an item (a template) from a list.
    Remove {
        /// The list.
        var: String,
        /// The item.
        value: String,
    },
    /// Empties a variable.
    Clear {
        /// The variable.
        var: String,
    },
    /// Resets a variable to its initial value.
    Reset {
        /// The variable.
        var: String,
    },
    /// Opens a screen on top of the current one.
    Go {
        /// The screen.
        screen: String,
    },
    /// Replaces the current screen.
    Replace {
        /// The screen.
        screen: String,
    },
    /// Closes the current screen.
    Back,
}

/// A guarded reaction to an action on a screen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transition {
    /// The screen it applies on.
    pub screen: String,
    /// The action kind.
    pub on: On,
    /// Short resource id or text of the widget acted on; any widget when absent.
    #[serde(default)]
    pub target: Option<String>,
    /// When it applies.
    #[serde(default)]
    pub when: Guard,
    /// What it does, in order.
    #[serde(default)]
    pub effects: Vec<Effect>,
}

/// A guarded crash: on a matching action, the app dies with this exception.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrashTrigger {
    /// The screen it applies on.
    pub screen: String,
    /// The action kind.
    pub on: On,
    /// Short resource id or text of the widget acted on; any widget when absent.
    #[serde(default)]
    pub target: Option<String>,
    /// When it fires.
    #[serde(default)]
    pub when: Guard,
    /// Exception class, e.g. `java.lang.NullPointerException`.
    pub exception: String,
    /// Exception message (a template).
    pub message: String,
    /// Stack frames, innermost first, without `at `.
    pub frames: Vec<String>,
}

/// A whole app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppModel {
    /// Package name, e.g. `com.example.notes`.
    pub package: String,
    /// The app's label on the home screen.
    pub label: String,
    /// Name of the first screen.
    pub launcher: String,
    /// Initial variable values.
    #[serde(default)]
    pub vars: Vars,
    /// Variables kept across process death (saved preferences, databases).
    #[serde(default)]
    pub persistent: Vec<String>,
    /// Screens.
    pub screens: Vec<Screen>,
    /// Transitions (first matching one wins).
    #[serde(default)]
    pub transitions: Vec<Transition>,
    /// Crash triggers (checked before transitions).
    #[serde(default)]
    pub crashes: Vec<CrashTrigger>,
}

/// Model loading and validation failures.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be read.
    #[error("cannot read {path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        err: std::io::Error,
    },
    /// The JSON is malformed.
    #[error("bad app model {path}: {err}")]
    Json {
        /// The file.
        path: String,
        /// The cause.
        err: serde_json::Error,
    },
    /// The model refers to something it does not define.
    #[error("invalid app model {package}: {problem}")]
    Invalid {
        /// The app.
        package: String,
        /// What is wrong.
        problem: String,
    },
}

impl AppModel {
    /// Reads and validates a model from a JSON file.
    pub fn load(path: &Path) -> Result<AppModel, ModelError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ModelError::Io {
            path: p.clone(),
            err,
        })?;
        let model: AppModel =
            serde_json::from_str(&text).map_err(|err| ModelError::Json { path: p, err })?;
        model.validate()?;
        Ok(model)
    }

    /// The screen called `name`.
    pub fn screen(&self, name: &str) -> Option<&Screen> {
        self.screens.iter().find(|s| s.name == name)
    }

    /// The full resource id for a short one (`""` stays `""`).
    pub fn resource_id(&self, short: &str) -> String {
        if short.is_empty() {
            String::new()
        } else {
            format!("{}:id/{short}", self.package)
        }
    }

    /// Checks that every screen and variable named anywhere is defined.
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |problem: String| {
            Err(ModelError::Invalid {
                package: self.package.clone(),
                problem,
            })
        };
        let screen = |name: &str, at: &str| {
            if self.screen(name).is_none() {
                bad(format!("unknown screen `{name}` in {at}"))
            } else {
                Ok(())
            }
        };
        let var = |name: &str, at: &str| {
            if !self.vars.contains_key(name) {
                bad(format!("unknown variable `{name}` in {at}"))
            } else {
                Ok(())
            }
        };
        let guard = |g: &Guard, at: &str| {
            g.iter().try_for_each(|c| {
                var(&c.var, at)?;
                match (&c.op, &c.value) {
                    (Op::Matches, Some(Value::Str(re))) if regex::Regex::new(re).is_err() => {
                        bad(format!("bad regular expression `{re}` in {at}"))
                    }
                    (Op::Matches, Some(Value::Str(_))) => Ok(()),
                    (Op::Matches, _) => bad(format!("`matches` needs a string pattern in {at}")),
                    _ => Ok(()),
                }
            })
        };
        screen(&self.launcher, "launcher")?;
        for v in &self.persistent {
            var(v, "persistent")?;
        }
        for s in &self.screens {
            let at = format!("screen {}", s.name);
            for v in &s.reset_on_rotate {
                var(v, &at)?;
            }
            for w in &s.widgets {
                for v in w.bind.iter().chain(w.list.iter()) {
                    var(v, &at)?;
                }
                guard(&w.visible_when, &at)?;
                for variant in &w.variants {
                    guard(&variant.when, &at)?;
                }
            }
        }
        for (i, t) in self.transitions.iter().enumerate() {
            let at = format!("transition {i} ({} {:?})", t.screen, t.on);
            screen(&t.screen, &at)?;
            guard(&t.when, &at)?;
            for e in &t.effects {
                match e {
                    Effect::Set { var: v, .. }
                    | Effect::Add { var: v, .. }
                    | Effect::Append { var: v, .. }
                    | Effect::Remove { var: v, .. }
                    | Effect::Clear { var: v }
                    | Effect::Reset { var: v } => var(v, &at)?,
                    Effect::Go { screen: s } | Effect::Replace { screen: s } => screen(s, &at)?,
                    Effect::Back => {}
                }
            }
        }
        for (i, c) in self.crashes.iter().enumerate() {
            let at = format!("crash trigger {i} ({})", c.exception);
            screen(&c.screen, &at)?;
            guard(&c.when, &at)?;
        }
        Ok(())
    }
}
