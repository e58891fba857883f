//! Sweep expansion: datasets × agents × variants × backbones × repeats → task rows. Pure.

use crate::store::NewTask;
use reprobench_domain::android::{self, AndroidPayload, AndroidRow};
use reprobench_domain::grading::GradingSettings;
use reprobench_domain::registry::{self, AgentKind, ExecutorKind, Track};
use reprobench_domain::sweep::{AgentSpec, SweepSpec};
use reprobench_domain::swt::{self, EvalLimits, Prediction, SwtAgent, SwtInstance, SwtPayload};
use reprobench_domain::synthetic::{self, SyntheticDataset, SyntheticPayload};
use std::collections::{BTreeMap, HashMap};

/// Files a sweep refers to, attached by the client (`dataset:NAME`, `predictions:PATH`).
pub type Attachments = BTreeMap<String, String>;

/// Attachment key of a dataset's rows.
pub fn dataset_key(name: &str) -> String {
    format!("dataset:{name}")
}

/// Attachment key of a predictions file.
pub fn predictions_key(path: &str) -> String {
    format!("predictions:{path}")
}

/// Why a sweep cannot be expanded, naming the input and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ExpandError(pub String);

/// How many tasks a sweep expands to, counted without expanding it: rows (attached lines, or a
/// synthetic dataset's size) × variants of every agent × backbones × repeats. Saturates.
pub fn task_count(spec: &SweepSpec, attachments: &Attachments) -> u64 {
    let rows: u64 = spec
        .datasets
        .iter()
        .map(|dataset| {
            let attached = attachments
                .get(&android::android_rows_key(dataset))
                .or_else(|| attachments.get(&dataset_key(dataset)));
            match (attached, SyntheticDataset::parse(dataset)) {
                (Some(rows), _) => rows.lines().filter(|l| !l.trim().is_empty()).count() as u64,
                (None, Some(Ok(synthetic))) => u64::from(synthetic.tasks),
                (None, Some(Err(_))) => 0,
                (None, None) => 0,
            }
        })
        .fold(0u64, u64::saturating_add);
    let variants: u64 = spec.agents.iter().map(|a| a.variants.len() as u64).sum();
    [
        variants,
        spec.backbone_names().len() as u64,
        u64::from(spec.repeats),
    ]
    .into_iter()
    .fold(rows, u64::saturating_mul)
}

/// Expands a sweep into its tasks, in a stable order; refuses one of more than `max_tasks`
/// before expanding it.
pub fn expand(
    spec: &SweepSpec,
    attachments: &Attachments,
    max_tasks: u64,
) -> Result<Vec<NewTask>, ExpandError> {
    let count = task_count(spec, attachments);
    if count > max_tasks {
        return Err(ExpandError(format!(
            "sweep `{}` expands to {count} tasks (rows × variants × backbones × repeats), more than this coordinator takes in one sweep ({max_tasks}): split it into smaller sweeps, or start the coordinator with a larger --max-sweep-tasks",
            spec.name
        )));
    }
    let backbones = spec.backbone_names();
    let mut tasks = Vec::with_capacity(count as usize);
    for dataset in &spec.datasets {
        if let Some(rows) = attachments.get(&android::android_rows_key(dataset)) {
            expand_android(spec, dataset, rows, &backbones, &mut tasks)?;
            continue;
        }
        if SyntheticDataset::parse(dataset).is_none() {
            expand_swt(spec, dataset, attachments, &backbones, &mut tasks)?;
            continue;
        }
        let instances = resolve_dataset(dataset, spec.seed)?;
        for agent in &spec.agents {
            check_agent(&agent.name, dataset)?;
            for variant in &agent.variants {
                for backbone in &backbones {
                    for repeat in 0..spec.repeats {
                        for (i, inst) in instances.iter().enumerate() {
                            let payload = SyntheticPayload {
                                duration_ms: inst.duration_ms,
                                success_probability: synthetic::SUCCESS_PROBABILITY,
                                seed: task_seed(spec.seed, i as u64, repeat, variant, backbone),
                            };
                            tasks.push(NewTask {
                                track: "synthetic".into(),
                                dataset: dataset.clone(),
                                instance_id: inst.instance_id.clone(),
                                repo_or_app: inst.affinity_key.clone(),
                                bug_type: None,
                                agent: agent.name.clone(),
                                variant: variant.clone(),
                                backbone: backbone.clone(),
                                repeat,
                                kind: ExecutorKind::Synthetic,
                                affinity_key: inst.affinity_key.clone(),
                                payload: serde_json::to_string(&payload)
                                    .expect("payload serializes"),
                                ground_truth_actions: None,
                            });
                        }
                    }
                }
            }
        }
    }
    Ok(tasks)
}

/// An agent that calls an LLM needs a backbone, and a built-in one runs only its `variants`.
fn check_llm_agent(
    spec: &SweepSpec,
    agent: &AgentSpec,
    calls_llm: bool,
    variants: Option<&[&str]>,
) -> Result<(), ExpandError> {
    if calls_llm && spec.backbones.is_empty() {
        return Err(ExpandError(format!(
            "agent `{}` calls an LLM: add a [[backbones]] entry (any OpenAI-compatible endpoint: name, base_url, model, api_key_env)",
            agent.name
        )));
    }
    if let Some(valid) = variants
        && let Some(bad) = agent.variants.iter().find(|v| !valid.contains(&v.as_str()))
    {
        return Err(ExpandError(format!(
            "agent `{}` has no variant `{bad}`; its variants are {}",
            agent.name,
            valid.join(", ")
        )));
    }
    Ok(())
}

fn expand_android(
    spec: &SweepSpec,
    dataset: &str,
    rows: &str,
    backbones: &[String],
    tasks: &mut Vec<NewTask>,
) -> Result<(), ExpandError> {
    let rows = android_rows(dataset, rows)?;
    for (i, row) in rows.iter().enumerate() {
        reprobench_domain::ids::checked("instance_id", &row.instance_id)
            .map_err(|e| ExpandError(format!("attached row {} of `{dataset}`: {e}", i + 1)))?;
    }
    for agent in &spec.agents {
        let builtin = registry::agent(Track::Android, &agent.name).ok_or_else(|| {
            ExpandError(format!(
                "agent `{}` cannot run android dataset `{dataset}`; the android agents are {}",
                agent.name,
                registry::agent_names(Track::Android)
            ))
        })?;
        let llm_variants = builtin.calls_llm.then_some(builtin.variants);
        if let Some(valid) = llm_variants {
            check_llm_agent(spec, agent, true, Some(valid))?;
        }
        for variant in &agent.variants {
            for backbone in backbones {
                let backbone_spec = llm_variants
                    .and_then(|_| spec.backbones.iter().find(|b| &b.name == backbone))
                    .cloned();
                for repeat in 0..spec.repeats {
                    for (i, row) in rows.iter().enumerate() {
                        let payload = AndroidPayload {
                            dataset: dataset.to_string(),
                            instance_id: row.instance_id.clone(),
                            agent: agent.name.clone(),
                            variant: variant.clone(),
                            seed: task_seed(spec.seed, i as u64, repeat, variant, backbone),
                            max_actions: spec.budget.max_actions,
                            max_minutes: spec.budget.max_minutes,
                            budget: backbone_spec.as_ref().map(|_| spec.budget.clone()),
                            backbone: backbone_spec.clone(),
                        };
                        tasks.push(NewTask {
                            track: "android".into(),
                            dataset: dataset.to_string(),
                            instance_id: row.instance_id.clone(),
                            repo_or_app: row.app.clone(),
                            bug_type: Some(row.bug_type.as_str().to_string()),
                            agent: agent.name.clone(),
                            variant: variant.clone(),
                            backbone: backbone.clone(),
                            repeat,
                            kind: android_kind(row),
                            affinity_key: row.app.clone(),
                            payload: serde_json::to_string(&payload).expect("payload serializes"),
                            ground_truth_actions: row.ground_truth_actions,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// The executor kinds a sweep's tasks will need, decided as [`expand`] decides them (without
/// building the tasks): synthetic datasets `synthetic`, attached android rows by
/// [`android_kind`], SWT datasets the sweep's `[eval] executor`.
pub fn task_kinds(
    spec: &SweepSpec,
    attachments: &Attachments,
) -> Result<std::collections::BTreeSet<ExecutorKind>, ExpandError> {
    let mut kinds = std::collections::BTreeSet::new();
    for dataset in &spec.datasets {
        if let Some(rows) = attachments.get(&android::android_rows_key(dataset)) {
            kinds.extend(android_rows(dataset, rows)?.iter().map(android_kind));
        } else if SyntheticDataset::parse(dataset).is_some() {
            kinds.insert(ExecutorKind::Synthetic);
        } else {
            kinds.insert(spec.eval.executor);
        }
    }
    Ok(kinds)
}

/// The attached android rows of `dataset` (JSON lines, blank lines skipped).
fn android_rows(dataset: &str, rows: &str) -> Result<Vec<AndroidRow>, ExpandError> {
    rows.lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .map_err(|e| ExpandError(format!("attached rows of `{dataset}` are invalid: {e}")))
}

/// The executor kind of an android row: real apps run on emulators, simulator suites on `sim`.
pub fn android_kind(row: &AndroidRow) -> ExecutorKind {
    if row.real_app {
        ExecutorKind::Emulator
    } else {
        ExecutorKind::Sim
    }
}

fn expand_swt(
    spec: &SweepSpec,
    dataset: &str,
    attachments: &Attachments,
    backbones: &[String],
    tasks: &mut Vec<NewTask>,
) -> Result<(), ExpandError> {
    let rows = attachments.get(&dataset_key(dataset)).ok_or_else(|| {
        ExpandError(format!(
            "dataset `{dataset}` is not attached: submit with `reprobench run`/`reprobench eval` from a machine that has it (they attach the rows), or use synthetic:N:MEAN_MS"
        ))
    })?;
    let parsed: swt::Parsed<SwtInstance> = swt::parse_rows(dataset, rows);
    if let Some(e) = parsed.errors.first() {
        return Err(ExpandError(format!(
            "attached rows of `{dataset}` are invalid: {e}"
        )));
    }
    let limits = EvalLimits {
        timeout_s: spec.eval.timeout_s,
        cpus: spec.eval.cpus,
        memory_mb: spec.eval.memory_mb,
        pids: spec.eval.pids,
        disk_mb: spec.eval.disk_mb,
    };
    for agent in &spec.agents {
        let predictions = swt_predictions(agent, attachments)?;
        let builtin = registry::agent(Track::Swt, &agent.name);
        let runs_llm = predictions.is_none() && builtin.is_none_or(|a| a.calls_llm);
        // Built-in agents have fixed variants; commands and images name their own.
        let builtin_variants = builtin
            .filter(|a| a.calls_llm && agent.command.is_none() && agent.image.is_none())
            .map(|a| a.variants);
        check_llm_agent(spec, agent, runs_llm, builtin_variants)?;
        let builtin_kind = builtin.map(|a| a.kind);
        for variant in &agent.variants {
            for backbone in backbones {
                let backbone_spec = spec.backbones.iter().find(|b| &b.name == backbone);
                for repeat in 0..spec.repeats {
                    for inst in &parsed.rows {
                        let env = inst.env.clone().ok_or_else(|| {
                            ExpandError(format!(
                                "attached row {} of `{dataset}` has no inline env",
                                inst.instance_id
                            ))
                        })?;
                        let swt_agent = match (&predictions, builtin_kind, backbone_spec) {
                            (Some(p), _, _) => SwtAgent::Prediction {
                                model: agent.name.clone(),
                                patch: p.get(&inst.instance_id).and_then(|p| p.model_patch.clone()),
                            },
                            (None, Some(AgentKind::Gold), _) => SwtAgent::Gold,
                            (None, Some(AgentKind::IssueSnippet), _) => SwtAgent::IssueSnippet,
                            (None, _, Some(b))
                                if agent.command.is_some() || agent.image.is_some() =>
                            {
                                SwtAgent::External {
                                    name: agent.name.clone(),
                                    command: agent.command.clone().unwrap_or_default(),
                                    image: agent.image.clone(),
                                    backbone: b.clone(),
                                    budget: spec.budget.clone(),
                                }
                            }
                            (None, _, Some(b)) => SwtAgent::Llm {
                                name: agent.name.clone(),
                                variant: variant.clone(),
                                backbone: b.clone(),
                                budget: spec.budget.clone(),
                            },
                            (None, _, None) => {
                                return Err(ExpandError(format!(
                                    "agent `{}` has no backbone `{backbone}`",
                                    agent.name
                                )));
                            }
                        };
                        let payload = SwtPayload {
                            instance: inst.clone(),
                            env: env.clone(),
                            agent: swt_agent,
                            limits: limits.clone(),
                            grading: GradingSettings {
                                rules: spec.eval.rules,
                                strict: spec.eval.strict,
                                coverage: spec.eval.coverage,
                            },
                        };
                        tasks.push(NewTask {
                            track: "swt".into(),
                            dataset: dataset.to_string(),
                            instance_id: inst.instance_id.clone(),
                            repo_or_app: inst.repo.clone(),
                            bug_type: None,
                            agent: agent.name.clone(),
                            variant: variant.clone(),
                            backbone: backbone.clone(),
                            repeat,
                            kind: spec.eval.executor,
                            affinity_key: env.env_key(),
                            payload: serde_json::to_string(&payload).expect("payload serializes"),
                            ground_truth_actions: None,
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// The predictions an SWT agent stands for, by instance id; `None` for the built-in agents.
fn swt_predictions(
    agent: &AgentSpec,
    attachments: &Attachments,
) -> Result<Option<HashMap<String, Prediction>>, ExpandError> {
    match (&agent.predictions, agent.name.as_str()) {
        (Some(path), _) => {
            let text = attachments.get(&predictions_key(path)).ok_or_else(|| {
                ExpandError(format!(
                    "predictions `{path}` of agent `{}` are not attached; submit with `reprobench run` or `reprobench eval`",
                    agent.name
                ))
            })?;
            let parsed: swt::Parsed<Prediction> = swt::parse_rows(path, text);
            Ok(Some(
                parsed
                    .rows
                    .into_iter()
                    .map(|p| (p.instance_id.clone(), p))
                    .collect(),
            ))
        }
        (None, _) if agent.command.is_some() || agent.image.is_some() => Ok(None),
        (None, name) if registry::agent(Track::Swt, name).is_some() => Ok(None),
        (None, synthetic::AGENT) => Err(ExpandError(
            "agent `synthetic` runs synthetic datasets only".into(),
        )),
        (None, other) => Err(ExpandError(format!(
            "agent `{other}` is not built in for the swt track; give it `predictions = \"FILE.jsonl\"` (SWT-bench predictions) or `command = [...]` (an external agent), or use one of {}",
            registry::agent_names(Track::Swt)
        ))),
    }
}

fn resolve_dataset(
    name: &str,
    seed: u64,
) -> Result<Vec<synthetic::SyntheticInstance>, ExpandError> {
    match SyntheticDataset::parse(name) {
        Some(Ok(d)) => Ok(d.instances(seed)),
        Some(Err(e)) => Err(ExpandError(e.to_string())),
        None => Err(ExpandError(format!(
            "dataset `{name}` is not available in this build; it knows synthetic:N:MEAN_MS[:SIGMA] (e.g. synthetic:200:20)"
        ))),
    }
}

fn check_agent(agent: &str, dataset: &str) -> Result<(), ExpandError> {
    if agent == synthetic::AGENT {
        Ok(())
    } else {
        Err(ExpandError(format!(
            "agent `{agent}` cannot run dataset `{dataset}`: synthetic datasets take agent `synthetic`"
        )))
    }
}

fn task_seed(seed: u64, index: u64, repeat: u32, variant: &str, backbone: &str) -> u64 {
    let mut h = fnv1a(
        seed.to_le_bytes()
            .iter()
            .chain(index.to_le_bytes().iter())
            .copied(),
    );
    h ^= u64::from(repeat).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ fnv1a(variant.bytes().chain([0]).chain(backbone.bytes()))
}

/// A stable hash of a sweep spec's canonical form and its attachments, used to find a run to resume.
pub fn sweep_hash(spec: &SweepSpec, attachments: &Attachments) -> String {
    let mut text = spec.to_toml();
    for (k, v) in attachments {
        text.push_str(&format!("\n@{k}:{}:{:016x}", v.len(), fnv1a(v.bytes())));
    }
    format!("{:016x}", fnv1a(text.bytes()))
}

fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT_MAX: u64 = crate::machine::DEFAULT_MAX_SWEEP_TASKS;

    fn spec(text: &str) -> SweepSpec {
        SweepSpec::from_toml(text).unwrap()
    }

    #[test]
    fn expands_the_full_matrix() {
        let s = spec(
            "name='m'\ndatasets=['synthetic:5:10','synthetic:3:10']\nrepeats=2\n[[agents]]\nname='synthetic'\nvariants=['full','no-x']\n",
        );
        let tasks = expand(&s, &Attachments::new(), u64::MAX).unwrap();
        assert_eq!(tasks.len(), (5 + 3) * 2 * 2);
        let cells: std::collections::BTreeSet<_> = tasks
            .iter()
            .map(|t| (&t.dataset, &t.instance_id, &t.variant, t.repeat))
            .collect();
        assert_eq!(cells.len(), tasks.len(), "every task is a distinct cell");
        assert_eq!(task_count(&s, &Attachments::new()), tasks.len() as u64);
        // One task more than allowed: refused before any is made, naming the limit and the flag.
        let refused = expand(&s, &Attachments::new(), tasks.len() as u64 - 1).unwrap_err();
        assert!(refused.0.contains("--max-sweep-tasks"), "{refused}");
        assert!(
            refused.0.contains(&format!("{} tasks", tasks.len())),
            "{refused}"
        );
        // A matrix too large to count in 64 bits is refused too.
        let huge = spec(
            "name='h'\ndatasets=['synthetic:4000000000:10']\nrepeats=4000000000\n[[agents]]\nname='synthetic'\nvariants=['full']\n",
        );
        assert_eq!(
            task_count(&huge, &Attachments::new()),
            16_000_000_000_000_000_000
        );
        assert!(expand(&huge, &Attachments::new(), DEFAULT_MAX).is_err());
        assert_eq!(
            expand(&s, &Attachments::new(), u64::MAX).unwrap().len(),
            tasks.len()
        );
        let none = Attachments::new();
        assert_eq!(
            sweep_hash(&s, &none),
            sweep_hash(&spec(&s.to_toml()), &none)
        );
    }

    #[test]
    fn real_app_rows_expand_to_emulator_tasks_and_sim_rows_to_sim() {
        let s = spec(
            "name='a'\ndatasets=['android-ltg75','android-sim']\n[[agents]]\nname='monkey'\nvariants=['default']\n",
        );
        let mut att = Attachments::new();
        att.insert(
            android::android_rows_key("android-ltg75"),
            concat!(
                r#"{"instance_id":"ActivityDiary-118","app":"ActivityDiary","bug_type":"crash","ground_truth_actions":15,"real_app":true}"#,
                "\n",
                r#"{"instance_id":"Anki-4200","app":"Anki","bug_type":"non-crash","ground_truth_actions":null,"real_app":true}"#,
                "\n"
            )
            .into(),
        );
        att.insert(
            android::android_rows_key("android-sim"),
            r#"{"instance_id":"notes-1","app":"notes","bug_type":"crash","ground_truth_actions":3}"#
                .to_string() + "\n",
        );
        let tasks = expand(&s, &att, u64::MAX).unwrap();
        let kinds: Vec<(&str, &str, &str)> = tasks
            .iter()
            .map(|t| (t.dataset.as_str(), t.instance_id.as_str(), t.kind.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("android-ltg75", "ActivityDiary-118", "emulator"),
                ("android-ltg75", "Anki-4200", "emulator"),
                ("android-sim", "notes-1", "sim"),
            ]
        );
        let expanded: std::collections::BTreeSet<ExecutorKind> =
            tasks.iter().map(|t| t.kind).collect();
        assert_eq!(
            task_kinds(&s, &att).unwrap(),
            expanded,
            "the kinds local nodes are given are the kinds the tasks get"
        );
        let with_synthetic = spec(
            "name='a'\ndatasets=['android-sim','synthetic:2:1']\n[[agents]]\nname='monkey'\nvariants=['default']\n",
        );
        assert_eq!(
            task_kinds(&with_synthetic, &att).unwrap(),
            [ExecutorKind::Sim, ExecutorKind::Synthetic].into()
        );
        assert_eq!(tasks[0].ground_truth_actions, Some(15));
        assert_eq!(tasks[1].bug_type.as_deref(), Some("non-crash"));
        let p: AndroidPayload = serde_json::from_str(&tasks[0].payload).unwrap();
        assert_eq!(
            (p.dataset.as_str(), p.agent.as_str()),
            ("android-ltg75", "monkey")
        );
    }

    fn expand_plain(s: &SweepSpec) -> Result<Vec<NewTask>, ExpandError> {
        expand(s, &Attachments::new(), u64::MAX)
    }

    #[test]
    fn unknown_dataset_and_wrong_agent_are_named() {
        let e = expand_plain(&spec(
            "name='m'\ndatasets=['nope']\n[[agents]]\nname='synthetic'\n",
        ))
        .unwrap_err();
        assert!(e.0.contains("`nope`"), "{e}");
        let e = expand_plain(&spec(
            "name='m'\ndatasets=['synthetic:2:1']\n[[agents]]\nname='libro'\n",
        ))
        .unwrap_err();
        assert!(e.0.contains("`libro`"), "{e}");
    }

    #[test]
    fn llm_and_external_agents_carry_their_backbone_and_budget() {
        let row = r#"{"instance_id":"o__r-1","repo":"o/r","base_commit":"c","patch":"p","test_patch":"t","problem_statement":"s","version":"1","env":{"test_cmd":"pytest","packages":["pytest"]}}"#;
        let mut att = Attachments::new();
        att.insert(dataset_key("mini"), format!("{row}\n"));
        let agents = "[[agents]]\nname='reproagent'\nvariants=['full','no-rca']\n[[agents]]\nname='mine'\ncommand=['python3','a.py']\n";
        let no_backbone = spec(&format!("name='e'\ndatasets=['mini']\n{agents}"));
        let e = expand(&no_backbone, &att, u64::MAX).unwrap_err();
        assert!(e.0.contains("[[backbones]]"), "{e}");
        let bad_variant = spec(
            "name='e'\ndatasets=['mini']\n[[agents]]\nname='reproagent'\nvariants=['no-such']\n[[backbones]]\nname='b'\nbase_url='http://x/v1'\nmodel='m'\n",
        );
        let e = expand(&bad_variant, &att, u64::MAX).unwrap_err();
        assert!(e.0.contains("no-such") && e.0.contains("no-review"), "{e}");
        let s = spec(&format!(
            "name='e'\ndatasets=['mini']\n{agents}[[backbones]]\nname='b'\nbase_url='http://x/v1'\nmodel='m'\napi_key_env='K'\n[budget]\nmax_llm_calls=7\n"
        ));
        let tasks = expand(&s, &att, u64::MAX).unwrap();
        assert_eq!(
            tasks.len(),
            3,
            "two reproagent variants and the external agent"
        );
        let payloads: Vec<SwtPayload> = tasks
            .iter()
            .map(|t| serde_json::from_str(&t.payload).unwrap())
            .collect();
        assert!(matches!(
            &payloads[1].agent,
            SwtAgent::Llm { name, variant, backbone, budget }
                if name == "reproagent" && variant == "no-rca" && backbone.model == "m" && budget.max_llm_calls == Some(7)
        ));
        assert!(matches!(
            &payloads[2].agent,
            SwtAgent::External { command, backbone, .. } if command == &["python3", "a.py"] && backbone.name == "b"
        ));
        assert!(tasks.iter().all(|t| t.backbone == "b"));
    }

    #[test]
    fn swt_datasets_expand_per_agent_with_predictions_and_env_keys() {
        let row = r#"{"instance_id":"o__r-1","repo":"o/r","base_commit":"c","patch":"p","test_patch":"t","problem_statement":"s","version":"1","env":{"test_cmd":"pytest","packages":["pytest"]}}"#;
        let mut att = Attachments::new();
        att.insert(dataset_key("mini"), format!("{row}\n"));
        att.insert(
            predictions_key("p.jsonl"),
            "{\"instance_id\":\"o__r-1\",\"model_name_or_path\":\"m\",\"model_patch\":\"diff\"}\n"
                .into(),
        );
        let s = spec(
            "name='e'\ndatasets=['mini']\n[eval]\nexecutor='process'\n[[agents]]\nname='gold'\n[[agents]]\nname='issue-snippet'\n[[agents]]\nname='m'\npredictions='p.jsonl'\n",
        );
        let tasks = expand(&s, &att, u64::MAX).unwrap();
        assert_eq!(tasks.len(), 3);
        assert!(tasks.iter().all(|t| t.kind == ExecutorKind::Process
            && t.track == "swt"
            && t.repo_or_app == "o/r"));
        assert_eq!(tasks[0].affinity_key, tasks[2].affinity_key);
        let p: SwtPayload = serde_json::from_str(&tasks[2].payload).unwrap();
        assert_eq!(
            p.agent,
            SwtAgent::Prediction {
                model: "m".into(),
                patch: Some("diff".into())
            }
        );
        assert_ne!(sweep_hash(&s, &att), sweep_hash(&s, &Attachments::new()));
    }
}
