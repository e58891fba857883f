//! [`SimDevice`]: a simulated Android device running one [`AppModel`]. It says it is a
//! simulator: `backend()` is `sim` and the home screen is `sim.launcher`.

use super::model::{AppModel, Effect, On, Value, Vars, expand, holds};
use super::render;
use crate::device::{
    Action, Bounds, Crash, Device, DeviceError, DeviceFuture, Direction, Hierarchy, Key, Widget,
    WidgetRef,
};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// Package of the simulator's home screen.
pub const LAUNCHER_PACKAGE: &str = "sim.launcher";
/// Activity of the simulator's home screen.
pub const LAUNCHER_ACTIVITY: &str = "sim.launcher/.Home";
const SCREEN_W: i32 = 1080;
const SCREEN_H: i32 = 1920;

/// Simulated latencies in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimLatency {
    /// Per UI action.
    pub action_ms: u64,
    /// Per snapshot save.
    pub snapshot_save_ms: u64,
    /// Per snapshot load.
    pub snapshot_load_ms: u64,
    /// Per app launch.
    pub launch_ms: u64,
}

impl Default for SimLatency {
    /// ANCHORS.md: LTGDroid waits 2 s after an action and 6 s after a snapshot save; an emulator
    /// snapshot load takes ≈ 0.6–0.7 s. The 1.5 s launch is an assumption, not a measurement.
    fn default() -> Self {
        SimLatency {
            action_ms: 2000,
            snapshot_save_ms: 6000,
            snapshot_load_ms: 650,
            launch_ms: 1500,
        }
    }
}

impl SimLatency {
    /// No waiting at all (unit tests).
    pub const ZERO: SimLatency = SimLatency {
        action_ms: 0,
        snapshot_save_ms: 0,
        snapshot_load_ms: 0,
        launch_ms: 0,
    };

    /// Every latency multiplied by `factor` (e.g. 0.01 for fast end-to-end runs).
    pub fn scaled(self, factor: f64) -> SimLatency {
        let s = |ms: u64| (ms as f64 * factor.max(0.0)).round() as u64;
        SimLatency {
            action_ms: s(self.action_ms),
            snapshot_save_ms: s(self.snapshot_save_ms),
            snapshot_load_ms: s(self.snapshot_load_ms),
            launch_ms: s(self.launch_ms),
        }
    }
}

/// Everything a snapshot holds.
#[derive(Debug, Clone, PartialEq)]
struct SimState {
    installed: bool,
    /// The app process is alive.
    running: bool,
    /// The app is in front (else the home screen shows).
    foreground: bool,
    landscape: bool,
    vars: Vars,
    /// Screen names, bottom first; the last is shown.
    stack: Vec<String>,
    /// List scroll offsets by short widget id.
    scroll: BTreeMap<String, usize>,
    crash: Option<Crash>,
    /// Short id of the focused text field.
    focus: Option<String>,
}

/// A simulated device with one app model installed.
pub struct SimDevice {
    model: AppModel,
    latency: SimLatency,
    state: Mutex<SimState>,
    /// Shared with replicas: a snapshot saved on one can be loaded on any.
    snapshots: std::sync::Arc<Mutex<BTreeMap<String, SimState>>>,
}

/// Maps portrait model bounds onto the current orientation (landscape stretches x, squeezes y).
fn place(b: Bounds, landscape: bool) -> Bounds {
    if !landscape {
        return b;
    }
    let x = |v: i32| v * SCREEN_H / SCREEN_W;
    let y = |v: i32| v * SCREEN_W / SCREEN_H;
    Bounds {
        left: x(b.left),
        top: y(b.top),
        right: x(b.right),
        bottom: y(b.bottom),
    }
}

fn rejected(msg: impl Into<String>) -> DeviceError {
    DeviceError::Rejected(msg.into())
}

impl SimDevice {
    /// A device with `model` installed (not yet launched) and the given latencies.
    pub fn new(model: AppModel, latency: SimLatency) -> SimDevice {
        let state = SimState {
            installed: true,
            running: false,
            foreground: false,
            landscape: false,
            vars: model.vars.clone(),
            stack: Vec::new(),
            scroll: BTreeMap::new(),
            crash: None,
            focus: None,
        };
        SimDevice {
            model,
            latency,
            state: Mutex::new(state),
            snapshots: std::sync::Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Another device running the same app, in the state just after install, that shares this
    /// one's snapshot store (as emulators started from one AVD share its snapshots).
    pub fn replica(&self) -> SimDevice {
        let fresh = SimDevice::new(self.model.clone(), self.latency);
        SimDevice {
            snapshots: self.snapshots.clone(),
            ..fresh
        }
    }

    /// The device's name, which says it is simulated: `sim:<package>`.
    pub fn name(&self) -> String {
        format!("sim:{}", self.model.package)
    }

    /// The app model.
    pub fn model(&self) -> &AppModel {
        &self.model
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SimState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hierarchy for `st` (pure).
    fn build(&self, st: &SimState) -> Hierarchy {
        let (w, h) = if st.landscape {
            (SCREEN_H, SCREEN_W)
        } else {
            (SCREEN_W, SCREEN_H)
        };
        let full = Bounds {
            left: 0,
            top: 0,
            right: w,
            bottom: h,
        };
        let screen = st.stack.last().and_then(|s| self.model.screen(s));
        let Some(screen) = screen.filter(|_| st.foreground && st.running) else {
            let icon = Widget {
                class: "android.widget.TextView".into(),
                text: if st.installed {
                    self.model.label.clone()
                } else {
                    String::new()
                },
                content_desc: if st.installed {
                    self.model.label.clone()
                } else {
                    String::new()
                },
                package: LAUNCHER_PACKAGE.into(),
                bounds: Bounds {
                    left: 60,
                    top: 1500,
                    right: 300,
                    bottom: 1740,
                },
                clickable: st.installed,
                enabled: true,
                ..Widget::default()
            };
            let root = Widget {
                class: "android.widget.FrameLayout".into(),
                package: LAUNCHER_PACKAGE.into(),
                content_desc: "Simulated home screen".into(),
                bounds: full,
                enabled: true,
                children: if st.installed { vec![icon] } else { vec![] },
                ..Widget::default()
            };
            return Hierarchy { roots: vec![root] };
        };
        let pkg = &self.model.package;
        let mut children = Vec::new();
        for spec in &screen.widgets {
            if !holds(&spec.visible_when, &st.vars) {
                continue;
            }
            let template = spec
                .variants
                .iter()
                .find(|v| holds(&v.when, &st.vars))
                .map_or(spec.text.as_str(), |v| v.text.as_str());
            let bound = spec.bind.as_ref().and_then(|b| st.vars.get(b));
            let text = match (bound, spec.checkable) {
                (Some(v), false) if spec.variants.is_empty() => v.display(),
                _ => expand(template, &st.vars, ""),
            };
            let mut w = Widget {
                class: spec.class.clone(),
                resource_id: self.model.resource_id(&spec.id),
                text,
                content_desc: spec.content_desc.clone(),
                hint: spec.hint.clone(),
                package: pkg.clone(),
                bounds: place(spec.bounds(), st.landscape),
                clickable: spec.clickable,
                long_clickable: spec.long_clickable,
                checkable: spec.checkable,
                checked: spec.checkable && bound == Some(&Value::Bool(true)),
                scrollable: spec.scrollable,
                enabled: spec.enabled,
                focused: !spec.id.is_empty() && st.focus.as_deref() == Some(spec.id.as_str()),
                ..Widget::default()
            };
            if let Some(Value::List(items)) = spec.list.as_ref().and_then(|l| st.vars.get(l)) {
                let page = spec.page.unwrap_or(6).max(1);
                let offset = st
                    .scroll
                    .get(&spec.id)
                    .copied()
                    .unwrap_or(0)
                    .min(items.len());
                let b = place(spec.bounds(), st.landscape);
                let row = ((b.bottom - b.top) / page as i32).max(1);
                for (i, item) in items.iter().skip(offset).take(page).enumerate() {
                    let top = b.top + row * i as i32;
                    w.children.push(Widget {
                        class: "android.widget.TextView".into(),
                        resource_id: self.model.resource_id(&spec.item_id),
                        text: item.clone(),
                        package: pkg.clone(),
                        bounds: Bounds {
                            left: b.left,
                            top,
                            right: b.right,
                            bottom: top + row,
                        },
                        clickable: true,
                        long_clickable: true,
                        enabled: true,
                        ..Widget::default()
                    });
                }
            }
            children.push(w);
        }
        let root = Widget {
            class: "android.widget.FrameLayout".into(),
            package: pkg.clone(),
            bounds: full,
            enabled: true,
            children,
            ..Widget::default()
        };
        Hierarchy { roots: vec![root] }
    }

    /// Finds the widget `r` names: by resource id (and text when several share it), else by text,
    /// else by content-desc.
    fn find(&self, h: &Hierarchy, r: &WidgetRef) -> Result<Widget, DeviceError> {
        let all = h.widgets();
        let pick = |cands: Vec<&Widget>| cands.first().map(|w| (*w).clone());
        let by_id: Vec<&Widget> = all
            .iter()
            .copied()
            .filter(|w| !r.resource_id.is_empty() && w.resource_id == r.resource_id)
            .collect();
        let found = if !by_id.is_empty() {
            let with_text: Vec<&Widget> =
                by_id.iter().copied().filter(|w| w.text == r.text).collect();
            pick(if with_text.is_empty() || by_id.len() == 1 {
                by_id
            } else {
                with_text
            })
        } else if !r.resource_id.is_empty() {
            None
        } else if !r.text.is_empty() {
            pick(all.iter().copied().filter(|w| w.text == r.text).collect())
        } else if !r.content_desc.is_empty() {
            pick(
                all.iter()
                    .copied()
                    .filter(|w| w.content_desc == r.content_desc)
                    .collect(),
            )
        } else if r.bounds != Bounds::default() {
            // Only a position: the last (deepest, topmost) widget containing its centre.
            let (x, y) = r.bounds.center();
            let hit = |w: &&Widget| {
                w.bounds.left <= x && x < w.bounds.right && w.bounds.top <= y && y < w.bounds.bottom
            };
            all.iter().copied().rfind(hit).cloned()
        } else {
            None
        };
        found.ok_or_else(|| rejected(format!("no widget matching {r:?} on screen")))
    }

    fn short_id<'a>(&self, rid: &'a str) -> &'a str {
        rid.rsplit_once(":id/").map_or(rid, |(_, s)| s)
    }

    fn matches(&self, target: &Option<String>, w: Option<&Widget>) -> bool {
        match (target, w) {
            (None, _) => true,
            (Some(t), Some(w)) => t == self.short_id(&w.resource_id) || *t == w.text,
            (Some(_), None) => false,
        }
    }

    /// Fires a crash trigger or the first matching transition for `on` (pure state update).
    /// Returns whether something matched.
    fn react(&self, st: &mut SimState, on: On, w: Option<&Widget>) -> bool {
        let Some(screen) = st.stack.last().cloned() else {
            return false;
        };
        let text = w.map_or("", |w| w.text.as_str());
        for c in &self.model.crashes {
            if c.screen == screen
                && c.on == on
                && self.matches(&c.target, w)
                && holds(&c.when, &st.vars)
            {
                st.crash = Some(Crash {
                    process: self.model.package.clone(),
                    exception: c.exception.clone(),
                    message: expand(&c.message, &st.vars, text),
                    frames: c.frames.clone(),
                });
                st.running = false;
                st.foreground = false;
                return true;
            }
        }
        let Some(t) = self.model.transitions.iter().find(|t| {
            t.screen == screen
                && t.on == on
                && self.matches(&t.target, w)
                && holds(&t.when, &st.vars)
        }) else {
            return false;
        };
        for e in &t.effects {
            match e {
                Effect::Set { var, value } => {
                    let v = match value {
                        Value::Str(s) => Value::Str(expand(s, &st.vars, text)),
                        other => other.clone(),
                    };
                    st.vars.insert(var.clone(), v);
                }
                Effect::Add { var, by } => {
                    if let Some(Value::Int(i)) = st.vars.get_mut(var) {
                        *i += by;
                    }
                }
                Effect::Append { var, value } => {
                    let item = expand(value, &st.vars, text);
                    if let Some(Value::List(l)) = st.vars.get_mut(var) {
                        l.push(item);
                    }
                }
                Effect::Remove { var, value } => {
                    let item = expand(value, &st.vars, text);
                    if let Some(Value::List(l)) = st.vars.get_mut(var) {
                        l.retain(|x| *x != item);
                    }
                }
                Effect::Clear { var } => {
                    if let Some(v) = st.vars.get_mut(var) {
                        *v = v.cleared();
                    }
                }
                Effect::Reset { var } => {
                    if let Some(v) = self.model.vars.get(var) {
                        st.vars.insert(var.clone(), v.clone());
                    }
                }
                Effect::Go { screen } => st.stack.push(screen.clone()),
                Effect::Replace { screen } => {
                    st.stack.pop();
                    st.stack.push(screen.clone());
                }
                Effect::Back => {
                    st.stack.pop();
                    if st.stack.is_empty() {
                        st.running = false;
                        st.foreground = false;
                    }
                }
            }
        }
        true
    }

    fn start(&self, st: &mut SimState) -> Result<(), DeviceError> {
        if !st.installed {
            return Err(rejected(format!("{} is not installed", self.model.package)));
        }
        if !st.running {
            let mut vars = self.model.vars.clone();
            for p in &self.model.persistent {
                if let Some(v) = st.vars.get(p) {
                    vars.insert(p.clone(), v.clone());
                }
            }
            st.vars = vars;
            st.stack = vec![self.model.launcher.clone()];
            st.scroll.clear();
            st.running = true;
        }
        st.foreground = true;
        st.crash = None;
        Ok(())
    }

    /// Applies one action to the state and keeps track of the focused text field.
    fn apply(&self, action: &Action) -> Result<(), DeviceError> {
        let mut st = self.lock();
        let top = st.stack.last().cloned();
        let focus = match action {
            Action::Click { target } | Action::InputText { target, .. } => self
                .find(&self.build(&st), target)
                .ok()
                .filter(|w| w.is_text_field())
                .map(|w| self.short_id(&w.resource_id).to_string()),
            _ => None,
        };
        self.act_on(&mut st, action)?;
        if focus.is_some() {
            st.focus = focus;
        }
        if st.stack.last() != top.as_ref() || !(st.foreground && st.running) {
            st.focus = None;
        }
        Ok(())
    }

    /// Applies one action to `st` (no waiting).
    fn act_on(&self, st: &mut SimState, action: &Action) -> Result<(), DeviceError> {
        let h = self.build(st);
        let in_app = st.foreground && st.running;
        match action {
            Action::Click { target } => {
                let w = self.find(&h, target)?;
                if !in_app {
                    return self.start(st);
                }
                if !w.enabled {
                    return Ok(());
                }
                let spec_bind = self
                    .spec_of(st, &w)
                    .and_then(|s| if s.checkable { s.bind.clone() } else { None });
                if let Some(var) = spec_bind {
                    let now = st.vars.get(&var) == Some(&Value::Bool(true));
                    st.vars.insert(var, Value::Bool(!now));
                }
                self.react(st, On::Click, Some(&w));
            }
            Action::LongClick { target } => {
                let w = self.find(&h, target)?;
                if in_app && w.enabled {
                    self.react(st, On::LongClick, Some(&w));
                }
            }
            Action::InputText { target, text } => {
                let w = self.find(&h, target)?;
                if !in_app || !w.is_text_field() {
                    let what = if w.class.is_empty() {
                        "the home screen"
                    } else {
                        w.class.as_str()
                    };
                    return Err(rejected(format!(
                        "cannot type into {what}: not a text field"
                    )));
                }
                if let Some(var) = self.spec_of(st, &w).and_then(|s| s.bind.clone()) {
                    let v = match st.vars.get(&var) {
                        Some(Value::Int(_)) => {
                            text.parse().map(Value::Int).unwrap_or(Value::Int(0))
                        }
                        _ => Value::Str(text.clone()),
                    };
                    st.vars.insert(var, v);
                }
                let typed = Widget {
                    text: text.clone(),
                    ..w
                };
                self.react(st, On::InputText, Some(&typed));
            }
            Action::Press { key } => match key {
                Key::Home => st.foreground = false,
                Key::Back if in_app && !self.react(st, On::Back, None) => {
                    st.stack.pop();
                    if st.stack.is_empty() {
                        st.running = false;
                        st.foreground = false;
                    }
                }
                Key::Delete if in_app => {
                    let bound = st.focus.as_ref().and_then(|f| {
                        let screen = self.model.screen(st.stack.last()?)?;
                        screen.widgets.iter().find(|w| w.id == *f)?.bind.clone()
                    });
                    if let Some(Value::Str(s)) = bound.and_then(|b| st.vars.get_mut(&b)) {
                        s.pop();
                    }
                }
                Key::Enter if in_app => {
                    self.react(st, On::Enter, None);
                }
                _ => {}
            },
            Action::Swipe { direction, target } => {
                if !in_app {
                    return Ok(());
                }
                let w = match target {
                    Some(r) => Some(self.find(&h, r)?),
                    None => h.widgets().into_iter().find(|w| w.scrollable).cloned(),
                };
                if let Some(w) = &w {
                    let spec = self.spec_of(st, w).cloned();
                    if let Some(spec) = spec.filter(|s| s.list.is_some()) {
                        let len = match spec.list.as_ref().and_then(|l| st.vars.get(l)) {
                            Some(Value::List(l)) => l.len(),
                            _ => 0,
                        };
                        let page = spec.page.unwrap_or(6).max(1);
                        let off = st.scroll.entry(spec.id.clone()).or_insert(0);
                        *off = match direction {
                            Direction::Up => (*off + page - 1).min(len.saturating_sub(page)),
                            Direction::Down => off.saturating_sub(page - 1),
                            _ => *off,
                        };
                    }
                }
                self.react(st, On::Swipe, w.as_ref());
            }
            Action::Rotate => {
                st.landscape = !st.landscape;
                if in_app {
                    let lost = st
                        .stack
                        .last()
                        .and_then(|s| self.model.screen(s))
                        .map(|s| s.reset_on_rotate.clone())
                        .unwrap_or_default();
                    for var in lost {
                        if let Some(v) = self.model.vars.get(&var) {
                            st.vars.insert(var, v.clone());
                        }
                    }
                    self.react(st, On::Rotate, None);
                }
            }
        }
        Ok(())
    }

    fn spec_of(&self, st: &SimState, w: &Widget) -> Option<&super::model::WidgetSpec> {
        let screen = self.model.screen(st.stack.last()?)?;
        let id = self.short_id(&w.resource_id);
        screen
            .widgets
            .iter()
            .find(|s| !s.id.is_empty() && s.id == id)
    }

    async fn wait(ms: u64) {
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
    }
}

impl Device for SimDevice {
    fn backend(&self) -> &'static str {
        "sim"
    }

    fn hierarchy(&self) -> DeviceFuture<'_, Hierarchy> {
        Box::pin(async move { Ok(self.build(&self.lock())) })
    }

    fn screenshot(&self) -> DeviceFuture<'_, Vec<u8>> {
        Box::pin(async move {
            let st = self.lock();
            let h = self.build(&st);
            Ok(render::render(&h))
        })
    }

    fn act<'a>(&'a self, action: &'a Action) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            self.apply(action)?;
            Self::wait(self.latency.action_ms).await;
            Ok(())
        })
    }

    fn current_activity(&self) -> DeviceFuture<'_, String> {
        Box::pin(async move {
            let st = self.lock();
            let screen = st.stack.last().and_then(|s| self.model.screen(s));
            Ok(match screen.filter(|_| st.foreground && st.running) {
                Some(s) => format!("{}/{}", self.model.package, s.activity),
                None => LAUNCHER_ACTIVITY.to_string(),
            })
        })
    }

    fn crash(&self) -> DeviceFuture<'_, Option<Crash>> {
        Box::pin(async move { Ok(self.lock().crash.clone()) })
    }

    fn save_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let st = self.lock().clone();
            self.snapshots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name.to_string(), st);
            Self::wait(self.latency.snapshot_save_ms).await;
            Ok(())
        })
    }

    fn load_snapshot<'a>(&'a self, name: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let snap = self
                .snapshots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(name)
                .cloned();
            let mut snap = snap.ok_or_else(|| rejected(format!("no snapshot named `{name}`")))?;
            snap.crash = None;
            *self.lock() = snap;
            Self::wait(self.latency.snapshot_load_ms).await;
            Ok(())
        })
    }

    fn install<'a>(&'a self, apk: &'a Path) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            let stem = apk.file_stem().and_then(|s| s.to_str()).unwrap_or("");
            if stem != self.model.package {
                return Err(rejected(format!(
                    "sim device runs only {}; cannot install {}",
                    self.model.package,
                    apk.display()
                )));
            }
            self.lock().installed = true;
            Ok(())
        })
    }

    fn launch<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            if package != self.model.package {
                return Err(rejected(format!(
                    "package {package} is not installed on {}",
                    self.name()
                )));
            }
            self.start(&mut self.lock())?;
            Self::wait(self.latency.launch_ms).await;
            Ok(())
        })
    }

    fn clear<'a>(&'a self, package: &'a str) -> DeviceFuture<'a, ()> {
        Box::pin(async move {
            if package != self.model.package {
                return Err(rejected(format!(
                    "package {package} is not installed on {}",
                    self.name()
                )));
            }
            let mut st = self.lock();
            st.vars = self.model.vars.clone();
            st.stack.clear();
            st.scroll.clear();
            st.running = false;
            st.foreground = false;
            st.crash = None;
            Ok(())
        })
    }
}
