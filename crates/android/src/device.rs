//! What every Android device offers the agents: the UI hierarchy, screenshots, actions, the
//! current activity, a crash oracle, snapshots, and app management. Backends: `adb` (real
//! emulators and phones) and `sim` (self-made app models; it says it is a simulator).

use serde::{Deserialize, Serialize};
use std::future::Future;
use std::path::Path;
use std::pin::Pin;

/// A device call in flight.
pub type DeviceFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DeviceError>> + Send + 'a>>;

/// Screen rectangle in pixels, as uiautomator prints it (`[left,top][right,bottom]`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bounds {
    /// Left edge.
    pub left: i32,
    /// Top edge.
    pub top: i32,
    /// Right edge (exclusive).
    pub right: i32,
    /// Bottom edge (exclusive).
    pub bottom: i32,
}

impl Bounds {
    /// The centre point, where a tap lands.
    pub fn center(&self) -> (i32, i32) {
        ((self.left + self.right) / 2, (self.top + self.bottom) / 2)
    }
}

/// One node of the UI hierarchy, with the uiautomator attributes agents read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Widget {
    /// `class`, e.g. `android.widget.Button`.
    pub class: String,
    /// `resource-id`, e.g. `com.example:id/save`.
    pub resource_id: String,
    /// `text`.
    pub text: String,
    /// `content-desc`.
    pub content_desc: String,
    /// `hint` (API 26+).
    pub hint: String,
    /// `package`.
    pub package: String,
    /// `bounds`.
    pub bounds: Bounds,
    /// `clickable`.
    pub clickable: bool,
    /// `long-clickable`.
    pub long_clickable: bool,
    /// `checkable`.
    pub checkable: bool,
    /// `checked`.
    pub checked: bool,
    /// `scrollable`.
    pub scrollable: bool,
    /// `enabled`.
    pub enabled: bool,
    /// `focused`.
    pub focused: bool,
    /// Child nodes in order.
    pub children: Vec<Widget>,
}

impl Widget {
    /// This widget and all its descendants, depth first.
    pub fn descendants(&self) -> Vec<&Widget> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            let w = out[i];
            out.extend(w.children.iter());
            i += 1;
        }
        out
    }

    /// Whether `class` names an editable text field.
    pub fn is_text_field(&self) -> bool {
        self.class.ends_with("EditText") || self.class.ends_with("AutoCompleteTextView")
    }
}

/// A screen's hierarchy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Hierarchy {
    /// Root nodes (uiautomator dumps one per window).
    pub roots: Vec<Widget>,
}

impl Hierarchy {
    /// Every widget, depth first.
    pub fn widgets(&self) -> Vec<&Widget> {
        self.roots.iter().flat_map(|r| r.descendants()).collect()
    }
}

/// How an action names its widget: the attributes an agent saw, and where it was.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WidgetRef {
    /// `resource-id` ("" when none).
    pub resource_id: String,
    /// `text` ("" when none).
    pub text: String,
    /// `content-desc` ("" when none).
    pub content_desc: String,
    /// `class`.
    pub class: String,
    /// `bounds` when seen.
    pub bounds: Bounds,
}

impl WidgetRef {
    /// A reference to `w`.
    pub fn of(w: &Widget) -> WidgetRef {
        WidgetRef {
            resource_id: w.resource_id.clone(),
            text: w.text.clone(),
            content_desc: w.content_desc.clone(),
            class: w.class.clone(),
            bounds: w.bounds,
        }
    }
}

/// Hardware keys agents press.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Key {
    /// Back.
    Back,
    /// Enter.
    Enter,
    /// Delete (backspace).
    Delete,
    /// Home.
    Home,
}

/// Swipe directions (the direction the finger moves).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Finger moves up (content scrolls down).
    Up,
    /// Finger moves down.
    Down,
    /// Finger moves left.
    Left,
    /// Finger moves right.
    Right,
}

/// One UI action.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// Tap a widget.
    Click {
        /// The widget.
        target: WidgetRef,
    },
    /// Long-press a widget.
    LongClick {
        /// The widget.
        target: WidgetRef,
    },
    /// Focus a text field and type into it (replacing its content).
    InputText {
        /// The field.
        target: WidgetRef,
        /// The text typed.
        text: String,
    },
    /// Press a key.
    Press {
        /// The key.
        key: Key,
    },
    /// Swipe on a widget (or the whole screen).
    Swipe {
        /// Direction of the finger.
        direction: Direction,
        /// The widget swiped on; the screen when `None`.
        target: Option<WidgetRef>,
    },
    /// Rotate the screen (portrait ↔ landscape).
    Rotate,
}

/// Simple names of the exceptions a report's text names (`java.lang.NullPointerException` and
/// `NullPointerException` both give `NullPointerException`); bare `Exception` or `Error` name
/// none.
pub fn named_exceptions(text: &str) -> std::collections::BTreeSet<String> {
    static NAMED: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let named = NAMED.get_or_init(|| {
        regex::Regex::new(r"\b(?:[a-z_$][\w$]*\.)*([A-Z][\w$]*?(?:Exception|Error))\b")
            .expect("static regex")
    });
    named
        .captures_iter(text)
        .map(|c| c[1].to_string())
        .collect()
}

/// The exceptions a report names in its title or body (see [`named_exceptions`]): the crash
/// oracle's reference for which crash is the reported one.
pub fn reported_exceptions(
    report: &reprobench_domain::android::AndroidReport,
) -> std::collections::BTreeSet<String> {
    named_exceptions(&format!("{}\n{}", report.title, report.body))
}

/// An app crash, as the crash oracle reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Crash {
    /// The crashed process (the app's package).
    pub process: String,
    /// Exception class, e.g. `java.lang.NullPointerException`.
    pub exception: String,
    /// Exception message.
    pub message: String,
    /// Top stack frames (`at ...` lines, without `at `).
    pub frames: Vec<String>,
}

impl Crash {
    /// Whether this is the crash a report names: its exception, or one its message carries
    /// (a `RuntimeException` wrapping the cause), is among `named`; any crash when the report
    /// names none.
    pub fn is_reported(&self, named: &std::collections::BTreeSet<String>) -> bool {
        if named.is_empty() {
            return true;
        }
        let simple = self.exception.rsplit('.').next().unwrap_or_default();
        named.contains(simple)
            || named_exceptions(&self.message)
                .iter()
                .any(|n| named.contains(n))
    }
}

/// Device failures.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// The device or its transport failed (offline, adb died, emulator hung): retry elsewhere.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// The request cannot be carried out (no such widget, no such snapshot, bad APK).
    #[error("{0}")]
    Rejected(String),
}

/// An Android device.
pub trait Device: Send + Sync {
    /// Backend name (`adb` or `sim`).
    fn backend(&self) -> &'static str;
    /// The current UI hierarchy.
    fn hierarchy(&self) -> DeviceFuture<'_, Hierarchy>;
    /// A screenshot (PNG bytes).
    fn screenshot(&self) -> DeviceFuture<'_, Vec<u8>>;
    /// Performs one action.
    fn act<'a>(&'a self, action: &'a Action) -> DeviceFuture<'a, ()>;
    /// The foreground activity, e.g. `com.example/.MainActivity`.
    fn current_activity(&self) -> DeviceFuture<'_, String>;
    /// The app's crash since the last launch, clear or snapshot load, if any.
    fn crash(&self) -> DeviceFuture<'_, Option<Crash>>;
    /// Saves the whole device state under `name`.
    fn save_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()>;
    /// Restores the state saved under `name`.
    fn load_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()>;
    /// Installs an APK.
    fn install<'a>(&'a self, apk: &'a Path) -> DeviceFuture<'a, ()>;
    /// Launches the app's main activity.
    fn launch<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()>;
    /// Clears the app's data and stops it.
    fn clear<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()>;
}
