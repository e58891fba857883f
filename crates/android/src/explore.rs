//! What can be done on a screen, and the agent that needs no LLM: `monkey` (seeded random
//! actions from the screen's hierarchy). `enumerate_actions` is pure; LTGDroid's path explorer
//! starts from the same list.

use super::device::{Action, Crash, Device, DeviceError, Direction, Hierarchy, Key, WidgetRef};
use reprobench_domain::synthetic::SplitMix64;
use serde::{Deserialize, Serialize};

/// Text typed into fields by agents that have no text of their own to type.
pub const DEFAULT_INPUT: &str = "test";

/// Which actions an enumeration offers beyond each widget's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActionRules {
    /// Text fields get a click too when clickable (not only text input).
    pub click_text_fields: bool,
    /// Swipe directions offered on scrollable widgets.
    pub swipes: &'static [Direction],
    /// Keys pressed on any screen.
    pub keys: &'static [Key],
    /// Swipe directions offered on the whole screen (no target widget).
    pub screen_swipes: &'static [Direction],
    /// Whether rotating the screen is offered.
    pub rotate: bool,
}

/// `monkey`'s rules: swipes up and down, Back.
pub const MONKEY_RULES: ActionRules = ActionRules {
    click_text_fields: false,
    swipes: &[Direction::Up, Direction::Down],
    keys: &[Key::Back],
    screen_swipes: &[],
    rotate: true,
};

impl ActionRules {
    /// Whether an action of `a`'s kind is in this action space on a screen that has its target
    /// (a text field is known by its class; a targeted swipe is covered by a screen-wide swipe
    /// in its direction, which scrolls the screen's scrollable widget).
    pub fn covers(&self, a: &Action) -> bool {
        match a {
            Action::Click { target } => {
                self.click_text_fields || !target.class.ends_with("EditText")
            }
            Action::LongClick { .. } | Action::InputText { .. } => true,
            Action::Press { key } => self.keys.contains(key),
            Action::Swipe { direction, target } => {
                self.screen_swipes.contains(direction)
                    || (target.is_some() && self.swipes.contains(direction))
            }
            Action::Rotate => self.rotate,
        }
    }
}

/// Every action the screen offers under `rules`: per enabled widget, text input into fields,
/// clicks and long-clicks as the widget allows, swipes on scrollable widgets; then the keys,
/// the screen-wide swipes and rotation.
pub fn enumerate_with(h: &Hierarchy, rules: &ActionRules) -> Vec<Action> {
    let mut out = Vec::new();
    for w in h.widgets() {
        if !w.enabled {
            continue;
        }
        let target = WidgetRef::of(w);
        let field = w.is_text_field();
        if field {
            out.push(Action::InputText {
                target: target.clone(),
                text: DEFAULT_INPUT.into(),
            });
        }
        if (w.clickable || w.checkable) && (!field || rules.click_text_fields) {
            out.push(Action::Click {
                target: target.clone(),
            });
        }
        if w.long_clickable {
            out.push(Action::LongClick {
                target: target.clone(),
            });
        }
        if w.scrollable {
            for &direction in rules.swipes {
                out.push(Action::Swipe {
                    direction,
                    target: Some(target.clone()),
                });
            }
        }
    }
    out.extend(rules.keys.iter().map(|&key| Action::Press { key }));
    out.extend(rules.screen_swipes.iter().map(|&direction| Action::Swipe {
        direction,
        target: None,
    }));
    if rules.rotate {
        out.push(Action::Rotate);
    }
    out
}

/// Every action the screen offers under [`MONKEY_RULES`]: clicks and long-clicks on enabled
/// widgets that accept them, text input into fields, swipes on scrollable widgets, Back and
/// rotation.
pub fn enumerate_actions(h: &Hierarchy) -> Vec<Action> {
    enumerate_with(h, &MONKEY_RULES)
}

/// A number below `n` (`n > 0`) from the seeded generator `monkey` draws from.
fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n as u64) as usize
}

/// What a run on a device did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceOutcome {
    /// The actions executed, from app start.
    pub trace: Vec<Action>,
    /// The crash the oracle saw, if any.
    pub crash: Option<Crash>,
    /// The hierarchy at the end.
    pub last_screen: Hierarchy,
}

/// `monkey`: launches the app and performs up to `max_actions` seeded random actions from each
/// screen's enumeration, stopping at the first crash. After leaving the app (Back on its first
/// screen), it relaunches it, as Android's monkey keeps to one package.
pub async fn monkey(
    dev: &dyn Device,
    package: &str,
    seed: u64,
    max_actions: usize,
) -> Result<TraceOutcome, DeviceError> {
    let mut rng = SplitMix64::new(seed);
    let mut out = TraceOutcome::default();
    dev.launch(package).await?;
    while out.trace.len() < max_actions {
        let h = dev.hierarchy().await?;
        let in_app = h
            .widgets()
            .iter()
            .any(|w| w.package == package || w.package.is_empty());
        if !in_app {
            dev.launch(package).await?;
            continue;
        }
        let actions = enumerate_actions(&h);
        let action = actions[below(&mut rng, actions.len())].clone();
        match dev.act(&action).await {
            Ok(()) => out.trace.push(action),
            // A widget gone between the dump and the act: draw again.
            Err(DeviceError::Rejected(_)) => continue,
            Err(e) => return Err(e),
        }
        if let Some(c) = dev.crash().await? {
            out.crash = Some(c);
            break;
        }
    }
    out.last_screen = dev.hierarchy().await?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{Bounds, Widget};

    fn widget(class: &str, id: &str) -> Widget {
        Widget {
            class: class.into(),
            resource_id: id.into(),
            enabled: true,
            bounds: Bounds {
                left: 0,
                top: 0,
                right: 100,
                bottom: 50,
            },
            ..Default::default()
        }
    }

    #[test]
    fn each_widget_offers_what_its_attributes_allow() {
        let mut button = widget("android.widget.Button", "app:id/save");
        button.clickable = true;
        let mut row = widget("android.widget.TextView", "app:id/row");
        row.clickable = true;
        row.long_clickable = true;
        let field = widget("android.widget.EditText", "app:id/name");
        let mut list = widget("android.widget.ListView", "app:id/list");
        list.scrollable = true;
        let mut disabled = widget("android.widget.Button", "app:id/off");
        disabled.clickable = true;
        disabled.enabled = false;
        let mut root = widget("android.widget.FrameLayout", "");
        root.children = vec![button, row, field, list, disabled];
        let actions = enumerate_actions(&Hierarchy { roots: vec![root] });
        let names: Vec<String> = actions
            .iter()
            .map(|a| match a {
                Action::Click { target } => format!("click {}", target.resource_id),
                Action::LongClick { target } => format!("long {}", target.resource_id),
                Action::InputText { target, .. } => format!("input {}", target.resource_id),
                Action::Swipe { direction, .. } => format!("swipe {direction:?}"),
                Action::Press { key } => format!("press {key:?}"),
                Action::Rotate => "rotate".into(),
            })
            .collect();
        assert_eq!(
            names,
            [
                "click app:id/save",
                "click app:id/row",
                "long app:id/row",
                "input app:id/name",
                "swipe Up",
                "swipe Down",
                "press Back",
                "rotate"
            ]
        );
    }

    #[test]
    fn the_generator_is_seeded() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let b: Vec<u64> = (0..4)
            .map({
                let mut r = SplitMix64::new(7);
                move |_| r.next_u64()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(a[0], SplitMix64::new(8).next_u64());
    }
}
