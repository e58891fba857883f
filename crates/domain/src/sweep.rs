//! The sweep spec (TOML): datasets × agents × variants × backbones × repeats.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A parsed, validated sweep spec.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SweepSpec {
    /// Name shown in status and written to every result row (`sweep`).
    pub name: String,
    /// Dataset names, e.g. `swt-mini` or `synthetic:200:20`.
    pub datasets: Vec<String>,
    /// How many times each (instance, agent, variant, backbone) cell runs.
    #[serde(default = "one")]
    pub repeats: u32,
    /// Seed for everything random the harness decides (synthetic data, sampling order).
    #[serde(default)]
    pub seed: u64,
    /// Bound on attempts per task before it is recorded as errored (infra failures only).
    #[serde(default = "three")]
    pub max_attempts: u32,
    /// Agents and their variants.
    pub agents: Vec<AgentSpec>,
    /// Backbone LLMs; a sweep of agents that use no LLM may leave this empty.
    #[serde(default)]
    pub backbones: Vec<BackboneSpec>,
    /// Per-task budget.
    #[serde(default)]
    pub budget: Budget,
    /// How SWT evaluations run (executor kind and sandbox limits).
    #[serde(default)]
    pub eval: EvalSettings,
}

/// How SWT executions run: the executor kind and each execution's limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSettings {
    /// `docker` or `process`.
    pub executor: crate::registry::ExecutorKind,
    /// Seconds per execution before the process tree is killed (SWT-bench: 1800).
    pub timeout_s: u64,
    /// CPUs per execution.
    pub cpus: f64,
    /// Memory per execution (MiB).
    pub memory_mb: u64,
    /// Processes per execution.
    pub pids: u64,
    /// Scratch disk per execution (MiB).
    pub disk_mb: u64,
    /// Version of SWT-bench's grading rules (`swt-bench-2025-09`, `swt-bench-2024`).
    pub rules: crate::grading::Rules,
    /// reprobench's suspicious findings change verdicts.
    pub strict: bool,
    /// Trace line coverage of the golden patch's files (SWT-bench's coverage figures).
    pub coverage: bool,
}

impl Default for EvalSettings {
    fn default() -> Self {
        EvalSettings {
            executor: crate::registry::ExecutorKind::Docker,
            timeout_s: 1800,
            cpus: 1.0,
            memory_mb: 2048,
            pids: 256,
            disk_mb: 1024,
            rules: crate::grading::Rules::default(),
            strict: false,
            coverage: true,
        }
    }
}

/// One agent in a sweep.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Agent name, e.g. `reproagent`, `ltgdroid`, `synthetic`.
    pub name: String,
    /// Variants (ablations); `full` when omitted.
    #[serde(default = "full_variant")]
    pub variants: Vec<String>,
    /// SWT: a predictions file (JSONL, SWT-bench format) whose test patches this agent stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predictions: Option<String>,
    /// SWT: an external agent run as this command (argv) on the node; see README, "External agents".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// SWT: an external agent packaged as a local container image (run with `command` as its
    /// arguments, if given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// An OpenAI-compatible LLM endpoint with its model, prices and sampling parameters.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BackboneSpec {
    /// Name used in results (`backbone`).
    pub name: String,
    /// Base URL of the OpenAI-compatible API, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name sent upstream.
    pub model: String,
    /// Name of the environment variable that holds the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Prices in dollars per million tokens.
    #[serde(default)]
    pub price: Price,
    /// Sampling parameters passed through (temperature, top_p, ...).
    #[serde(default)]
    pub params: BTreeMap<String, toml::Value>,
    /// Most requests in flight to this backbone at once, across all tasks (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u32>,
    /// Most requests started per minute to this backbone, across all tasks (default unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u32>,
    /// Seconds one upstream request may take before it is abandoned and retried (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
    /// The model reads text only (e.g. a small local model): the gateway turns each message's
    /// content parts into one string, with a note in place of each image (default false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub text_only: bool,
}

/// Prices in dollars per million tokens.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Uncached input tokens.
    #[serde(default)]
    pub input_per_mtok: f64,
    /// Output tokens.
    #[serde(default)]
    pub output_per_mtok: f64,
    /// Cached input tokens.
    #[serde(default)]
    pub cached_input_per_mtok: f64,
}

/// Per-task limits; the defaults are the papers' settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Android: UI actions per task.
    pub max_actions: u32,
    /// Wall-clock minutes per task.
    pub max_minutes: f64,
    /// SWT: LLM calls per agent stage.
    pub max_llm_calls_per_stage: u32,
    /// SWT: feedback iterations of test refinement.
    pub max_feedback_iterations: u32,
    /// Dollars per task.
    pub max_cost_usd: f64,
    /// LLM calls per task, all stages together (none: only the per-stage limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_llm_calls: Option<u64>,
    /// Tokens (input + output) per task (none: unlimited).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_actions: 100,
            max_minutes: 60.0,
            max_llm_calls_per_stage: 50,
            max_feedback_iterations: 20,
            max_cost_usd: 2.0,
            max_llm_calls: None,
            max_tokens: None,
        }
    }
}

fn one() -> u32 {
    1
}
fn three() -> u32 {
    3
}
fn full_variant() -> Vec<String> {
    vec!["full".to_string()]
}

/// A sweep spec that cannot be used, with what to change.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The TOML does not parse or does not match the spec's fields.
    #[error("sweep spec is not valid TOML for a sweep: {0}")]
    Toml(String),
    /// The TOML parses but a value is unusable.
    #[error("sweep spec: {0}")]
    Invalid(String),
}

impl SweepSpec {
    /// Parses and validates a sweep spec from TOML text.
    pub fn from_toml(text: &str) -> Result<SweepSpec, SweepError> {
        let spec: SweepSpec = toml::from_str(text).map_err(|e| SweepError::Toml(e.to_string()))?;
        spec.validate()?;
        Ok(spec)
    }

    /// Serializes back to TOML (stored with the run so it can be resumed and inspected).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a sweep spec always serializes")
    }

    fn validate(&self) -> Result<(), SweepError> {
        let bad = |m: String| Err(SweepError::Invalid(m));
        if self.name.trim().is_empty() {
            return bad("`name` must not be empty".into());
        }
        if self.datasets.is_empty() {
            return bad(
                "`datasets` is empty; name at least one, e.g. datasets = [\"synthetic:100:20\"]"
                    .into(),
            );
        }
        if self.agents.is_empty() {
            return bad(
                "no `[[agents]]` entry; add one, e.g. [[agents]] name = \"synthetic\"".into(),
            );
        }
        if self.repeats == 0 {
            return bad("`repeats` must be at least 1".into());
        }
        if !matches!(
            self.eval.executor,
            crate::registry::ExecutorKind::Docker | crate::registry::ExecutorKind::Process
        ) {
            return bad(format!(
                "[eval] executor `{}` does not run SWT executions; use \"docker\" or \"process\"",
                self.eval.executor
            ));
        }
        if self.eval.timeout_s == 0 {
            return bad("[eval] timeout_s must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return bad("`max_attempts` must be at least 1".into());
        }
        for a in &self.agents {
            crate::ids::checked("agent name", &a.name).map_err(SweepError::Invalid)?;
            for v in &a.variants {
                crate::ids::checked(&format!("agent `{}`: variant", a.name), v)
                    .map_err(SweepError::Invalid)?;
            }
            if a.variants.is_empty() {
                return bad(format!(
                    "agent `{}` lists no variants; omit `variants` for [\"full\"]",
                    a.name
                ));
            }
            if a.command.as_ref().is_some_and(|c| c.is_empty()) {
                return bad(format!(
                    "agent `{}`: `command` is empty; give the argv, e.g. command = [\"python3\", \"/path/agent.py\"]",
                    a.name
                ));
            }
            if a.predictions.is_some() && (a.command.is_some() || a.image.is_some()) {
                return bad(format!(
                    "agent `{}` has both `predictions` and `command`/`image`; an agent is either a predictions file or something to run",
                    a.name
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for b in &self.backbones {
            crate::ids::checked("backbone name", &b.name).map_err(SweepError::Invalid)?;
            if !names.insert(&b.name) {
                return bad(format!("backbone name `{}` appears twice", b.name));
            }
            if let Some(env) = &b.api_key_env
                && (env.starts_with("sk-") || env.len() > 64)
            {
                return bad(format!(
                    "backbone `{}`: api_key_env must name an environment variable, not hold a key",
                    b.name
                ));
            }
        }
        Ok(())
    }

    /// Backbone names to expand over; a sweep without backbones runs once with backbone `none`.
    pub fn backbone_names(&self) -> Vec<String> {
        if self.backbones.is_empty() {
            vec!["none".to_string()]
        } else {
            self.backbones.iter().map(|b| b.name.clone()).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DESIGN_EXAMPLE: &str = r#"
name = "ltgdroid-ablation"
datasets = ["android-sim"]
repeats = 3
[[agents]]
name = "ltgdroid"
variants = ["full", "no-ra", "no-ae", "no-ta", "no-bv"]
[[backbones]]
name = "gpt-4.1"
base_url = "https://api.openai.com/v1"
model = "gpt-4.1"
api_key_env = "OPENAI_API_KEY"
price = { input_per_mtok = 2.0, output_per_mtok = 8.0, cached_input_per_mtok = 0.5 }
params = { temperature = 0.0 }
[budget]
max_actions = 100
max_minutes = 60
max_llm_calls_per_stage = 50
max_feedback_iterations = 20
max_cost_usd = 2.0
"#;

    #[test]
    fn parses_the_design_example() {
        let s = SweepSpec::from_toml(DESIGN_EXAMPLE).unwrap();
        assert_eq!(s.repeats, 3);
        assert_eq!(s.agents[0].variants.len(), 5);
        assert_eq!(s.backbones[0].price.output_per_mtok, 8.0);
        assert_eq!(s.max_attempts, 3);
        let again = SweepSpec::from_toml(&s.to_toml()).unwrap();
        assert_eq!(again, s);
    }

    #[test]
    fn defaults_and_errors() {
        let s = SweepSpec::from_toml(
            "name='x'\ndatasets=['synthetic:3:1']\n[[agents]]\nname='synthetic'\n",
        )
        .unwrap();
        assert_eq!(s.agents[0].variants, vec!["full"]);
        assert_eq!(s.backbone_names(), vec!["none"]);
        assert_eq!(s.budget, Budget::default());
        let err =
            SweepSpec::from_toml("name='x'\ndatasets=[]\n[[agents]]\nname='a'\n").unwrap_err();
        assert!(err.to_string().contains("datasets"), "{err}");
        let err = SweepSpec::from_toml("name='x'\ndatasets=['d']\nagents=[]\n").unwrap_err();
        assert!(err.to_string().contains("[[agents]]"), "{err}");
        let err = SweepSpec::from_toml("name='x'\ndatset=['d']\n").unwrap_err();
        assert!(err.to_string().contains("datset"), "{err}");
    }
}
