//! Grading vocabulary shared by the client, the coordinator and the nodes: which version of
//! SWT-bench's rules grades an evaluation, and whether reprobench's own checks may change verdicts.

use serde::{Deserialize, Serialize};

/// A version of SWT-bench's grading rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Rules {
    /// SWT-bench's code since 2025-09 (commit 0816600 and after; checked against 330a649).
    #[default]
    #[serde(rename = "swt-bench-2025-09")]
    SwtBench202509,
    /// SWT-bench's code before commit 0816600: the rules of results published before it.
    #[serde(rename = "swt-bench-2024")]
    SwtBench2024,
}

impl Rules {
    /// Every version, the default first.
    pub const ALL: [Rules; 2] = [Rules::SwtBench202509, Rules::SwtBench2024];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Rules::SwtBench202509 => "swt-bench-2025-09",
            Rules::SwtBench2024 => "swt-bench-2024",
        }
    }

    /// The version called `name`.
    pub fn from_name(name: &str) -> Option<Rules> {
        Rules::ALL.into_iter().find(|r| r.name() == name)
    }

    /// Names of all versions, for messages.
    pub fn names() -> Vec<&'static str> {
        Rules::ALL.iter().map(|r| r.name()).collect()
    }

    /// Whether the sympy parser wants whitespace after a status (`test_x F `).
    pub fn sympy_status_needs_trailing_space(self) -> bool {
        self == Rules::SwtBench202509
    }
}

impl std::fmt::Display for Rules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no version of the grading rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown grading rules `{name}`; use one of: {}", Rules::names().join(", "))]
pub struct UnknownRulesError {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for Rules {
    type Err = UnknownRulesError;

    fn from_str(s: &str) -> Result<Rules, UnknownRulesError> {
        Rules::from_name(s).ok_or_else(|| UnknownRulesError {
            name: s.to_string(),
        })
    }
}

/// How an SWT evaluation is graded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GradingSettings {
    /// The version of SWT-bench's rules.
    pub rules: Rules,
    /// Suspicious findings change the verdict (passes of a run that exited non-zero count as
    /// failures; any other finding leaves the instance unresolved).
    pub strict: bool,
    /// Trace the golden patch's files in every execution, as SWT-bench's runs do by default,
    /// for its coverage figures.
    pub coverage: bool,
}

impl Default for GradingSettings {
    fn default() -> Self {
        GradingSettings {
            rules: Rules::default(),
            strict: false,
            coverage: true,
        }
    }
}
