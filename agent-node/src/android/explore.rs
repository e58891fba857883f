//! What can be done on a screen, and the agent that needs no LLM: `monkey` (seeded random
//! actions from the screen's hierarchy). `enumerate_actions` is pure; LTGDroid's path explorer
//! starts from the same list.

use super::device::{Action, Crash, Device, DeviceError, Direction, Hierarchy, Key, WidgetRef};
use serde::{Deserialize, Serialize};

/// Text typed into fields by agents that have no text of their own to type.
pub const DEFAULT_INPUT: &str = "test";

/// Every action the screen offers: clicks and long-clicks on enabled widgets that accept them,
/// text input into fields, swipes on scrollable widgets, Back and rotation.
pub fn enumerate_actions(h: &Hierarchy) -> Vec<Action> {
    let mut out = Vec::new();
    for w in h.widgets() {
        if !w.enabled {
            continue;
        }
        let target = WidgetRef::of(w);
        if w.is_text_field() {
            out.push(Action::InputText {
                target: target.clone(),
                text: DEFAULT_INPUT.into(),
            });
        } else if w.clickable || w.checkable {
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
            for direction in [Direction::Up, Direction::Down] {
                out.push(Action::Swipe {
                    direction,
                    target: Some(target.clone()),
                });
            }
        }
    }
    out.push(Action::Press { key: Key::Back });
    out.push(Action::Rotate);
    out
}

/// SplitMix64: the seeded generator `monkey` draws from.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
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
        let action = actions[rng.below(actions.len())].clone();
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
    use crate::android::device::{Bounds, Widget};

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
