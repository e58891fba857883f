//! The adb shell commands behind each [`Action`], and parsers for the shell outputs the device
//! backend reads (pure; no IO).
//!
//! Commands are device-shell command lines (`adb shell` hands its arguments to `sh -c` on the
//! device), so any user text in them is quoted for that shell here.

use crate::device::{Action, Bounds, DeviceError, Direction, Hierarchy, Key, Widget, WidgetRef};
use regex::Regex;
use std::sync::LazyLock;

/// How long a long-click presses, in milliseconds.
pub const LONG_PRESS_MS: u32 = 1000;
/// How long a swipe takes, in milliseconds.
pub const SWIPE_MS: u32 = 300;

/// What the commands of an action depend on: the screen just before it.
#[derive(Debug, Clone, Copy)]
pub struct Screen<'a> {
    /// The current hierarchy (targets are resolved in it).
    pub hierarchy: &'a Hierarchy,
    /// The current rotation (0–3, uiautomator's `rotation`).
    pub rotation: u8,
}

/// `input tap X Y`.
pub fn tap(x: i32, y: i32) -> String {
    format!("input tap {x} {y}")
}

/// `input swipe X1 Y1 X2 Y2 MS`.
pub fn swipe(from: (i32, i32), to: (i32, i32), ms: u32) -> String {
    format!("input swipe {} {} {} {} {ms}", from.0, from.1, to.0, to.1)
}

/// The keycode name of a key.
pub fn keycode(key: Key) -> &'static str {
    match key {
        Key::Back => "KEYCODE_BACK",
        Key::Enter => "KEYCODE_ENTER",
        Key::Delete => "KEYCODE_DEL",
        Key::Home => "KEYCODE_HOME",
    }
}

/// Quotes `s` as one word for the device's `sh`.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "%+,-./:=@_".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `input text` commands typing `text`: spaces become `%s` (what `input text` expects),
/// shell metacharacters are quoted, and newlines are typed as `KEYCODE_ENTER`.
///
/// `input text` can only type ASCII; other characters are rejected with an explanation.
pub fn input_text(text: &str) -> Result<Vec<String>, DeviceError> {
    if let Some(c) = text
        .chars()
        .find(|c| !c.is_ascii() || (c.is_control() && *c != '\n'))
    {
        return Err(DeviceError::Rejected(format!(
            "`adb shell input text` cannot type {c:?}; use ASCII text (non-ASCII needs an IME such as ADBKeyboard, not supported yet)"
        )));
    }
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push(format!("input keyevent {}", keycode(Key::Enter)));
        }
        if !line.is_empty() {
            out.push(format!(
                "input text {}",
                shell_quote(&line.replace(' ', "%s"))
            ));
        }
    }
    Ok(out)
}

/// The screen's extent: the union of the root windows' bounds.
pub fn screen_bounds(h: &Hierarchy) -> Bounds {
    h.roots.iter().fold(Bounds::default(), |a, w| Bounds {
        left: a.left.min(w.bounds.left),
        top: a.top.min(w.bounds.top),
        right: a.right.max(w.bounds.right),
        bottom: a.bottom.max(w.bounds.bottom),
    })
}

/// Swipe end points inside `b`: from 80% to 20% along the direction of the finger.
pub fn swipe_points(b: Bounds, direction: Direction) -> ((i32, i32), (i32, i32)) {
    let (cx, cy) = b.center();
    let w = b.right - b.left;
    let h = b.bottom - b.top;
    let at = |frac: i32, start: i32, len: i32| start + len * frac / 10;
    match direction {
        Direction::Up => ((cx, at(8, b.top, h)), (cx, at(2, b.top, h))),
        Direction::Down => ((cx, at(2, b.top, h)), (cx, at(8, b.top, h))),
        Direction::Left => ((at(8, b.left, w), cy), (at(2, b.left, w), cy)),
        Direction::Right => ((at(2, b.left, w), cy), (at(8, b.left, w), cy)),
    }
}

fn contains(b: &Bounds, (x, y): (i32, i32)) -> bool {
    b.left <= x && x < b.right && b.top <= y && y < b.bottom
}

fn area(b: &Bounds) -> i64 {
    i64::from(b.right - b.left) * i64::from(b.bottom - b.top)
}

fn distance(a: &Bounds, b: &Bounds) -> i64 {
    let (ax, ay) = a.center();
    let (bx, by) = b.center();
    i64::from(ax - bx).pow(2) + i64::from(ay - by).pow(2)
}

/// The widget `r` names in a fresh hierarchy: an exact resource-id + text + class (+
/// content-desc) match first, then resource-id + class (a text field whose text changed),
/// nearest to where it was seen; finally the smallest widget under the centre of its old
/// bounds.
pub fn resolve<'a>(h: &'a Hierarchy, r: &WidgetRef) -> Option<&'a Widget> {
    let all = h.widgets();
    let nearest = |ws: Vec<&'a Widget>| {
        ws.into_iter()
            .min_by_key(|w| distance(&w.bounds, &r.bounds))
    };
    let identified = !(r.resource_id.is_empty() && r.text.is_empty() && r.content_desc.is_empty());
    if identified {
        let exact: Vec<&Widget> = all
            .iter()
            .copied()
            .filter(|w| {
                w.resource_id == r.resource_id
                    && w.text == r.text
                    && w.class == r.class
                    && w.content_desc == r.content_desc
            })
            .collect();
        if let Some(w) = nearest(exact) {
            return Some(w);
        }
    }
    if !r.resource_id.is_empty() {
        let by_id: Vec<&Widget> = all
            .iter()
            .copied()
            .filter(|w| w.resource_id == r.resource_id && w.class == r.class)
            .collect();
        if let Some(w) = nearest(by_id) {
            return Some(w);
        }
    }
    if r.bounds == Bounds::default() {
        return None;
    }
    let c = r.bounds.center();
    all.into_iter()
        .filter(|w| contains(&w.bounds, c) && area(&w.bounds) > 0)
        .min_by_key(|w| area(&w.bounds))
}

fn target<'a>(s: &Screen<'a>, r: &WidgetRef) -> Result<&'a Widget, DeviceError> {
    resolve(s.hierarchy, r).ok_or_else(|| {
        DeviceError::Rejected(format!(
            "no widget on screen matches {:?} (resource-id {:?}, text {:?}); read the hierarchy again and pick a visible widget",
            r.class, r.resource_id, r.text
        ))
    })
}

/// The `settings` commands that rotate to `rotation` (0–3) with auto-rotate off.
pub fn rotation_commands(rotation: u8) -> Vec<String> {
    vec![
        "settings put system accelerometer_rotation 0".to_string(),
        format!("settings put system user_rotation {}", rotation % 4),
    ]
}

/// The device-shell commands performing `action` on `screen`, in order.
pub fn action_commands(action: &Action, screen: &Screen<'_>) -> Result<Vec<String>, DeviceError> {
    Ok(match action {
        Action::Click { target: r } => {
            let (x, y) = target(screen, r)?.bounds.center();
            vec![tap(x, y)]
        }
        Action::LongClick { target: r } => {
            let p = target(screen, r)?.bounds.center();
            vec![swipe(p, p, LONG_PRESS_MS)]
        }
        Action::InputText { target: r, text } => {
            let w = target(screen, r)?;
            let (x, y) = w.bounds.center();
            let mut cmds = vec![tap(x, y)];
            // Replace the content: move to its end and delete every character.
            let n = w.text.chars().count();
            if n > 0 {
                let dels = vec!["KEYCODE_DEL"; n].join(" ");
                cmds.push(format!("input keyevent KEYCODE_MOVE_END {dels}"));
            }
            cmds.extend(input_text(text)?);
            cmds
        }
        Action::Press { key } => vec![format!("input keyevent {}", keycode(*key))],
        Action::Swipe {
            direction,
            target: r,
        } => {
            let area = match r {
                Some(r) => target(screen, r)?.bounds,
                None => screen_bounds(screen.hierarchy),
            };
            if area.right <= area.left || area.bottom <= area.top {
                return Err(DeviceError::Rejected(
                    "cannot swipe: the screen size is unknown (empty hierarchy); read the hierarchy first".into(),
                ));
            }
            let (from, to) = swipe_points(area, *direction);
            vec![swipe(from, to, SWIPE_MS)]
        }
        Action::Rotate => {
            // Portrait <-> landscape: 0/2 -> 1, 1/3 -> 0.
            rotation_commands(if screen.rotation.is_multiple_of(2) {
                1
            } else {
                0
            })
        }
    })
}

static RESUMED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(topResumedActivity|mResumedActivity|ResumedActivity|mFocusedActivity)\s*[:=]\s*ActivityRecord\{\S+ u\d+ ([\w.$]+/[\w.$]+)",
    )
    .expect("valid regex")
});

/// The foreground activity from `dumpsys activity activities` (`com.example/.Main`).
///
/// Android 12+ prints `topResumedActivity=ActivityRecord{...}`, Android 10–11 and older
/// `mResumedActivity: ActivityRecord{...}`, Android 7 and older also `mFocusedActivity`.
pub fn parse_resumed_activity(dumpsys: &str) -> Option<String> {
    let rank = |k: &str| match k {
        "topResumedActivity" => 0,
        "mResumedActivity" => 1,
        "ResumedActivity" => 2,
        _ => 3,
    };
    RESUMED
        .captures_iter(dumpsys)
        .min_by_key(|c| rank(&c[1]))
        .map(|c| c[2].to_string())
}

/// Whether `getprop sys.boot_completed` says the device finished booting.
pub fn parse_boot_completed(out: &str) -> bool {
    out.trim() == "1"
}

/// The shell line whose output [`parse_boot_state`] reads.
pub const BOOT_PROBE: &str = "getprop sys.boot_completed; getprop init.svc.bootanim";

/// Whether [`BOOT_PROBE`]'s output says the device is ready: `sys.boot_completed` is `1` and
/// the boot animation is `stopped` (or absent, as with `-no-boot-anim` on some images).
pub fn parse_boot_state(out: &str) -> bool {
    let mut lines = out.lines().map(str::trim);
    let completed = lines.next().is_some_and(parse_boot_completed);
    let anim = lines.next().unwrap_or("");
    completed && (anim.is_empty() || anim == "stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adb::{fixture, uiautomator::parse_dump};

    fn notes() -> Hierarchy {
        parse_dump(&fixture("uiautomator_notes.xml")).unwrap()
    }

    fn by_id<'a>(h: &'a Hierarchy, id: &str) -> &'a Widget {
        h.widgets()
            .into_iter()
            .find(|w| w.resource_id == id)
            .unwrap()
    }

    #[test]
    fn click_long_click_keys() {
        let h = notes();
        let s = Screen {
            hierarchy: &h,
            rotation: 0,
        };
        let save = WidgetRef::of(by_id(&h, "com.example.notes:id/save"));
        assert_eq!(
            action_commands(
                &Action::Click {
                    target: save.clone()
                },
                &s
            )
            .unwrap(),
            ["input tap 540 1673"]
        );
        assert_eq!(
            action_commands(&Action::LongClick { target: save }, &s).unwrap(),
            ["input swipe 540 1673 540 1673 1000"]
        );
        assert_eq!(
            action_commands(&Action::Press { key: Key::Back }, &s).unwrap(),
            ["input keyevent KEYCODE_BACK"]
        );
        assert_eq!(keycode(Key::Home), "KEYCODE_HOME");
        assert_eq!(keycode(Key::Delete), "KEYCODE_DEL");
        assert_eq!(keycode(Key::Enter), "KEYCODE_ENTER");
    }

    #[test]
    fn input_text_replaces_and_escapes() {
        let h = notes();
        let s = Screen {
            hierarchy: &h,
            rotation: 0,
        };
        let mut field = by_id(&h, "com.example.notes:id/title").clone();
        field.text = "abc".into();
        let hh = Hierarchy {
            roots: vec![field.clone()],
        };
        let s2 = Screen {
            hierarchy: &hh,
            rotation: 0,
        };
        let cmds = action_commands(
            &Action::InputText {
                target: WidgetRef::of(&field),
                text: "it's a $HOME; `x`\nok".into(),
            },
            &s2,
        )
        .unwrap();
        assert_eq!(
            cmds,
            [
                "input tap 540 294",
                "input keyevent KEYCODE_MOVE_END KEYCODE_DEL KEYCODE_DEL KEYCODE_DEL",
                r"input text 'it'\''s%sa%s$HOME;%s`x`'",
                "input keyevent KEYCODE_ENTER",
                "input text ok",
            ]
        );
        let err = action_commands(
            &Action::InputText {
                target: WidgetRef::of(&field),
                text: "café".into(),
            },
            &s,
        )
        .unwrap_err();
        assert!(err.to_string().contains("ASCII"));
    }

    #[test]
    fn swipes_within_target_or_screen() {
        let h = notes();
        let s = Screen {
            hierarchy: &h,
            rotation: 0,
        };
        let list = WidgetRef::of(by_id(&h, "com.example.notes:id/list"));
        assert_eq!(
            action_commands(
                &Action::Swipe {
                    direction: Direction::Up,
                    target: Some(list)
                },
                &s
            )
            .unwrap(),
            ["input swipe 540 1195 540 582 300"]
        );
        assert_eq!(
            action_commands(
                &Action::Swipe {
                    direction: Direction::Left,
                    target: None
                },
                &s
            )
            .unwrap(),
            ["input swipe 864 960 216 960 300"]
        );
        let empty = Hierarchy::default();
        let e = Screen {
            hierarchy: &empty,
            rotation: 0,
        };
        assert!(
            action_commands(
                &Action::Swipe {
                    direction: Direction::Down,
                    target: None
                },
                &e
            )
            .is_err()
        );
    }

    #[test]
    fn rotation_toggles() {
        let h = notes();
        let cmds = action_commands(
            &Action::Rotate,
            &Screen {
                hierarchy: &h,
                rotation: 0,
            },
        )
        .unwrap();
        assert_eq!(
            cmds,
            [
                "settings put system accelerometer_rotation 0",
                "settings put system user_rotation 1"
            ]
        );
        let cmds = action_commands(
            &Action::Rotate,
            &Screen {
                hierarchy: &h,
                rotation: 3,
            },
        )
        .unwrap();
        assert_eq!(cmds[1], "settings put system user_rotation 0");
    }

    #[test]
    fn resolves_refs() {
        let h = notes();
        let save = by_id(&h, "com.example.notes:id/save");
        assert_eq!(resolve(&h, &WidgetRef::of(save)), Some(save));
        // Text changed: resource-id + class still finds it.
        let mut r = WidgetRef::of(by_id(&h, "com.example.notes:id/title"));
        r.text = "old".into();
        assert_eq!(
            resolve(&h, &r).unwrap().resource_id,
            "com.example.notes:id/title"
        );
        // Unknown attributes: the smallest widget under the old centre.
        let r = WidgetRef {
            class: "x.Gone".into(),
            text: "gone".into(),
            bounds: Bounds {
                left: 50,
                top: 400,
                right: 60,
                bottom: 410,
            },
            ..Default::default()
        };
        assert_eq!(resolve(&h, &r).unwrap().text, "Milk");
        let r = WidgetRef {
            text: "nowhere".into(),
            ..Default::default()
        };
        assert!(resolve(&h, &r).is_none());
        let s = Screen {
            hierarchy: &h,
            rotation: 0,
        };
        let err = action_commands(&Action::Click { target: r }, &s).unwrap_err();
        assert!(err.to_string().contains("read the hierarchy again"));
    }

    #[test]
    fn resumed_activity_across_versions() {
        assert_eq!(
            parse_resumed_activity(&fixture("dumpsys_activities_api34.txt")).as_deref(),
            Some("com.example.notes/.EditActivity")
        );
        assert_eq!(
            parse_resumed_activity(&fixture("dumpsys_activities_api29.txt")).as_deref(),
            Some("com.example.notes/com.example.notes.MainActivity")
        );
        assert_eq!(parse_resumed_activity("nothing here"), None);
    }

    #[test]
    fn boot_and_quote() {
        assert!(parse_boot_completed("1\r\n"));
        assert!(!parse_boot_completed(""));
        assert!(!parse_boot_completed("0\n"));
        assert!(parse_boot_state("1\r\nstopped\r\n"));
        assert!(parse_boot_state("1\n\n"));
        assert!(!parse_boot_state("1\nrunning\n"));
        assert!(!parse_boot_state("\nstopped\n"));
        assert_eq!(shell_quote("a.b"), "a.b");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a b"), "'a b'");
    }
}
