//! Names that become directory and file names (instance ids, run ids, sweep, agent, variant and
//! backbone names): checked where they enter, so that none can write outside its run's
//! directories. Pure.

/// Longest name accepted, in bytes (SWE-bench's longest instance id is under 60).
pub const MAX_NAME_BYTES: usize = 200;

/// Why a name cannot be used as one path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameProblem {
    /// Nothing, or only spaces.
    #[error("is empty")]
    Empty,
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("is {0} bytes long; at most {MAX_NAME_BYTES} are allowed")]
    TooLong(usize),
    /// Holds `/` or `\`.
    #[error("holds a path separator (`/` or `\\`)")]
    Separator,
    /// Holds `..`.
    #[error("holds `..`")]
    DotDot,
    /// Starts with `.` (a hidden file, or `.` itself).
    #[error("starts with `.`")]
    LeadingDot,
    /// Holds NUL or another control character.
    #[error("holds a control character (U+{0:04X})")]
    Control(u32),
}

/// Checks that `name` can be one path component: not empty, at most [`MAX_NAME_BYTES`], no `/`,
/// `\`, `..`, leading `.`, NUL or control character.
pub fn check_name(name: &str) -> Result<(), NameProblem> {
    if name.trim().is_empty() {
        return Err(NameProblem::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameProblem::TooLong(name.len()));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(NameProblem::Control(c as u32));
    }
    if name.contains(['/', '\\']) {
        return Err(NameProblem::Separator);
    }
    if name.contains("..") {
        return Err(NameProblem::DotDot);
    }
    if name.starts_with('.') {
        return Err(NameProblem::LeadingDot);
    }
    Ok(())
}

/// [`check_name`] as a message naming what the name is (`what`, e.g. "instance_id") and the fix.
pub fn checked(what: &str, name: &str) -> Result<(), String> {
    check_name(name).map_err(|problem| {
        format!(
            "{what} `{}` {problem}: it becomes a directory name, so it must be one path component (letters, digits, `-`, `_`, `.` not leading, at most {MAX_NAME_BYTES} bytes)",
            name.escape_debug()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_names_pass() {
        for ok in [
            "django__django-10914",
            "scikit-learn__scikit-learn-25747",
            "AnkiDroid-5756",
            "run-20261205-061214-10bc06",
            "full",
            "no-localization",
            "deepseek-v3",
            "qwen2.5:0.5b",
            "gpt-4o@2024",
            "a.b",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn escapes_are_refused_with_their_rule() {
        assert_eq!(check_name(""), Err(NameProblem::Empty));
        assert_eq!(check_name("  "), Err(NameProblem::Empty));
        assert_eq!(check_name("../x"), Err(NameProblem::Separator));
        assert_eq!(check_name("/etc"), Err(NameProblem::Separator));
        assert_eq!(check_name("a\\b"), Err(NameProblem::Separator));
        assert_eq!(check_name(".."), Err(NameProblem::DotDot));
        assert_eq!(check_name("a..b"), Err(NameProblem::DotDot));
        assert_eq!(check_name("."), Err(NameProblem::LeadingDot));
        assert_eq!(check_name(".git"), Err(NameProblem::LeadingDot));
        assert_eq!(check_name("a\0b"), Err(NameProblem::Control(0)));
        assert_eq!(check_name("a\nb"), Err(NameProblem::Control(10)));
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(check_name(&long), Err(NameProblem::TooLong(201)));
        assert_eq!(check_name(&long[1..]), Ok(()));
        let message = checked("instance_id", "../../etc").unwrap_err();
        assert!(message.contains("`../../etc`") && message.contains("instance_id"));
    }
}
