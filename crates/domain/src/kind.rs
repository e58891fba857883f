//! Executor kinds and the `KIND=N` slot syntax nodes use to advertise capacity.

use crate::registry::ExecutorKind;
use std::fmt;

/// A number of slots for one executor kind, as given by `--slots KIND=N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSpec {
    /// Executor kind.
    pub kind: ExecutorKind,
    /// How many attempts of this kind may run at once.
    pub slots: u32,
}

/// A `--slots` value that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSpecError(pub String);

impl fmt::Display for SlotSpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SlotSpecError {}

impl std::str::FromStr for SlotSpec {
    type Err = SlotSpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, n) = s.split_once('=').ok_or_else(|| {
            SlotSpecError(format!(
                "slots `{s}` should look like KIND=N, e.g. synthetic=4"
            ))
        })?;
        let Some(kind) = ExecutorKind::parse(kind) else {
            return Err(SlotSpecError(format!(
                "unknown executor kind `{kind}` in `{s}`; known kinds: {}",
                ExecutorKind::names()
            )));
        };
        let slots: u32 = n.parse().map_err(|_| {
            SlotSpecError(format!("slot count `{n}` in `{s}` is not a whole number"))
        })?;
        if slots == 0 || slots > 4096 {
            return Err(SlotSpecError(format!(
                "slot count in `{s}` must be between 1 and 4096"
            )));
        }
        Ok(SlotSpec { kind, slots })
    }
}

#[cfg(test)]
mod tests {
    use super::SlotSpec;

    fn check(input: &str, expected: Result<(&str, u32), &str>) {
        let got = input.parse::<SlotSpec>();
        match (got, expected) {
            (Ok(s), Ok((k, n))) => assert_eq!((s.kind.as_str(), s.slots), (k, n)),
            (Err(e), Err(fragment)) => assert!(e.0.contains(fragment), "{e}"),
            (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn parses_slot_specs() {
        check("synthetic=4", Ok(("synthetic", 4)));
        check("docker=1", Ok(("docker", 1)));
        check("gpu=1", Err("unknown executor kind"));
        check("synthetic", Err("KIND=N"));
        check("synthetic=x", Err("not a whole number"));
        check("synthetic=0", Err("between 1 and 4096"));
    }
}
