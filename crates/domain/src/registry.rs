//! The built-in agents and the executor kinds, as data. Sweep expansion checks agents and
//! variants here, nodes dispatch on [`AgentKind`], and `--help` lists both from this table, so a
//! new agent or kind is one row here plus its implementation.

use std::fmt;

/// The track an agent runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Track {
    /// SWT-bench: an issue becomes a failing test, graded fail-to-pass.
    Swt,
    /// Android: a bug report becomes a UI action trace on a device.
    Android,
}

/// Which built-in agent a name stands for; nodes dispatch on this, never on a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentKind {
    /// SWT: the instance's golden test patch.
    Gold,
    /// SWT: a test built on the node from the issue text's code snippet.
    IssueSnippet,
    /// SWT: ReproAgent (localization, root-cause analysis, planning, review).
    ReproAgent,
    /// SWT: one LLM call with the issue and retrieved code, as SWT-bench's ZeroShotPlus.
    ZeroShotPlus,
    /// SWT: LIBRO (few-shot samples, run and reranked by their failures).
    Libro,
    /// Android: replays the report's recorded reproduction trace.
    GoldTrace,
    /// Android: random UI events.
    Monkey,
    /// Android: LTGDroid (action pre-assessment on device replicas).
    LtgDroid,
    /// Android: ReBL (feedback-driven, from the whole report).
    Rebl,
    /// Android: ReBL with screenshots.
    ReblVisual,
    /// Android: AdbGPT.
    AdbGpt,
}

/// One built-in agent.
#[derive(Debug, Clone, Copy)]
pub struct AgentInfo {
    /// The name sweeps and `--agent` use.
    pub name: &'static str,
    /// What nodes dispatch on.
    pub kind: AgentKind,
    /// The track it runs on.
    pub track: Track,
    /// Whether it calls a backbone LLM (through the node's metering gateway).
    pub calls_llm: bool,
    /// The variants (ablations) it accepts; the first is the default.
    pub variants: &'static [&'static str],
    /// One line for `--help`.
    pub about: &'static str,
}

const FULL: &[&str] = &["full"];

/// Every built-in agent.
pub const AGENTS: &[AgentInfo] = &[
    AgentInfo {
        name: "gold",
        kind: AgentKind::Gold,
        track: Track::Swt,
        calls_llm: false,
        variants: FULL,
        about: "the instance's golden test patch (validates environments)",
    },
    AgentInfo {
        name: "issue-snippet",
        kind: AgentKind::IssueSnippet,
        track: Track::Swt,
        calls_llm: false,
        variants: FULL,
        about: "a test made from the issue's code snippet, no LLM",
    },
    AgentInfo {
        name: "reproagent",
        kind: AgentKind::ReproAgent,
        track: Track::Swt,
        calls_llm: true,
        variants: &[
            "full",
            "no-localization",
            "no-rca",
            "no-planning",
            "no-review",
        ],
        about: "ReproAgent: localization, root-cause analysis, planning and review",
    },
    AgentInfo {
        name: "zero-shot-plus",
        kind: AgentKind::ZeroShotPlus,
        track: Track::Swt,
        calls_llm: true,
        variants: FULL,
        about: "one call with the issue and retrieved code (SWT-bench's ZeroShotPlus)",
    },
    AgentInfo {
        name: "libro",
        kind: AgentKind::Libro,
        track: Track::Swt,
        calls_llm: true,
        variants: FULL,
        about: "LIBRO: few-shot samples run on the buggy code, the largest failure cluster chosen",
    },
    AgentInfo {
        name: "gold-trace",
        kind: AgentKind::GoldTrace,
        track: Track::Android,
        calls_llm: false,
        variants: FULL,
        about: "replays the report's recorded reproduction trace",
    },
    AgentInfo {
        name: "monkey",
        kind: AgentKind::Monkey,
        track: Track::Android,
        calls_llm: false,
        variants: FULL,
        about: "random UI events",
    },
    AgentInfo {
        name: "ltgdroid",
        kind: AgentKind::LtgDroid,
        track: Track::Android,
        calls_llm: true,
        variants: &["full", "no-ra", "no-ae", "no-ta", "no-bv"],
        about: "LTGDroid: candidate actions pre-assessed on device replicas",
    },
    AgentInfo {
        name: "rebl",
        kind: AgentKind::Rebl,
        track: Track::Android,
        calls_llm: true,
        variants: FULL,
        about: "ReBL: the whole report, one action per call, with feedback",
    },
    AgentInfo {
        name: "rebl-visual",
        kind: AgentKind::ReblVisual,
        track: Track::Android,
        calls_llm: true,
        variants: FULL,
        about: "ReBL with screenshots (needs a backbone that reads images)",
    },
    AgentInfo {
        name: "adbgpt",
        kind: AgentKind::AdbGpt,
        track: Track::Android,
        calls_llm: true,
        variants: FULL,
        about: "AdbGPT: steps extracted from the report, each matched to a widget",
    },
];

/// The built-in agent `name` of `track`, if there is one.
pub fn agent(track: Track, name: &str) -> Option<&'static AgentInfo> {
    AGENTS.iter().find(|a| a.track == track && a.name == name)
}

/// How `track`'s built-in agent `name` is dispatched, if there is one by that name.
pub fn agent_kind(track: Track, name: &str) -> Option<AgentKind> {
    agent(track, name).map(|a| a.kind)
}

/// The names of `track`'s built-in agents, comma-separated, for error messages.
pub fn agent_names(track: Track) -> String {
    AGENTS
        .iter()
        .filter(|a| a.track == track)
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The executor kinds a node can offer slots for. Decided once, where a task or a slot is made;
/// the name ([`ExecutorKind::as_str`]) exists only on the wire, in the store and in text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExecutorKind {
    /// SWT executions in containers (the Docker engine).
    Docker,
    /// SWT executions as sandboxed processes on the node.
    Process,
    /// Android agents on emulators (adb).
    Emulator,
    /// Android agents on the simulator (`android-sim`).
    Sim,
    /// Synthetic tasks that only exercise scheduling.
    Synthetic,
}

impl ExecutorKind {
    /// Every kind, in the order `--help` lists them.
    pub const ALL: [ExecutorKind; 5] = [
        ExecutorKind::Docker,
        ExecutorKind::Process,
        ExecutorKind::Emulator,
        ExecutorKind::Sim,
        ExecutorKind::Synthetic,
    ];

    /// The kind's name in `--slots KIND=N`, sweeps and the protocol.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutorKind::Docker => "docker",
            ExecutorKind::Process => "process",
            ExecutorKind::Emulator => "emulator",
            ExecutorKind::Sim => "sim",
            ExecutorKind::Synthetic => "synthetic",
        }
    }

    /// One line for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            ExecutorKind::Docker => "SWT executions in containers (Docker engine)",
            ExecutorKind::Process => "SWT executions as sandboxed processes",
            ExecutorKind::Emulator => "android agents on Android emulators (adb)",
            ExecutorKind::Sim => "android agents on the simulated device (android-sim)",
            ExecutorKind::Synthetic => "synthetic tasks (scheduling only)",
        }
    }

    /// Whether the kind runs agents, which call models through the node's gateway.
    pub fn runs_agents(self) -> bool {
        !matches!(self, ExecutorKind::Synthetic)
    }

    /// The kind named `name`, if there is one.
    pub fn parse(name: &str) -> Option<ExecutorKind> {
        ExecutorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Every kind's name, comma-separated, for error messages.
    pub fn names() -> String {
        ExecutorKind::ALL.map(ExecutorKind::as_str).join(", ")
    }
}

impl fmt::Display for ExecutorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for ExecutorKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ExecutorKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        ExecutorKind::parse(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown executor kind `{name}`; known kinds: {}",
                ExecutorKind::names()
            ))
        })
    }
}

/// The agents and executor kinds as `--help` text.
pub fn help_text() -> String {
    let mut out = String::new();
    for (track, title) in [
        (Track::Swt, "SWT agents"),
        (Track::Android, "Android agents"),
    ] {
        out.push_str(title);
        out.push_str(" (name [variants]: what it is; * calls a backbone LLM):\n");
        for a in AGENTS.iter().filter(|a| a.track == track) {
            let star = if a.calls_llm { "*" } else { " " };
            let variants = if a.variants.len() > 1 {
                format!(" [{}]", a.variants.join(", "))
            } else {
                String::new()
            };
            out.push_str(&format!("  {star}{}{variants}: {}\n", a.name, a.about));
        }
    }
    out.push_str("Executor kinds (--slots KIND=N):\n");
    for k in ExecutorKind::ALL {
        out.push_str(&format!("  {}: {}\n", k.as_str(), k.about()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_per_track_and_every_agent_has_a_default_variant() {
        for (i, a) in AGENTS.iter().enumerate() {
            assert!(
                !a.variants.is_empty() && a.variants[0] == "full",
                "{}",
                a.name
            );
            assert!(
                AGENTS[..i]
                    .iter()
                    .all(|b| b.track != a.track || b.name != a.name),
                "{} twice",
                a.name
            );
            assert_eq!(agent(a.track, a.name).map(|b| b.kind), Some(a.kind));
        }
        assert!(agent(Track::Android, "gold").is_none());
    }

    #[test]
    fn executor_kinds_round_trip_and_the_help_lists_everything() {
        for k in ExecutorKind::ALL {
            assert_eq!(ExecutorKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ExecutorKind::parse("gpu"), None);
        let help = help_text();
        for a in AGENTS {
            assert!(help.contains(a.name), "{}", a.name);
        }
        for k in ExecutorKind::ALL {
            assert!(help.contains(&format!("  {}: ", k.as_str())), "{k}");
        }
    }
}
