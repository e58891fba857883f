//! Sweep expansion: datasets × agents × variants × backbones × repeats → task rows. Pure.

use crate::store::NewTask;
use reprobench_proto::sweep::SweepSpec;
use reprobench_proto::synthetic::{self, SyntheticDataset, SyntheticPayload};

/// Why a sweep cannot be expanded, naming the input and the fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ExpandError(pub String);

/// Expands a sweep into its tasks, in a stable order.
pub fn expand(spec: &SweepSpec) -> Result<Vec<NewTask>, ExpandError> {
    let backbones = spec.backbone_names();
    let mut tasks = Vec::new();
    for dataset in &spec.datasets {
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
                                kind: "synthetic".into(),
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

fn resolve_dataset(
    name: &str,
    seed: u64,
) -> Result<Vec<synthetic::SyntheticInstance>, ExpandError> {
    match SyntheticDataset::parse(name) {
        Some(Ok(d)) => Ok(d.instances(seed)),
        Some(Err(e)) => Err(ExpandError(e)),
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

/// A stable hash of a sweep spec's canonical form, used to find a run to resume.
pub fn sweep_hash(spec: &SweepSpec) -> String {
    format!("{:016x}", fnv1a(spec.to_toml().bytes()))
}

fn fnv1a(bytes: impl Iterator<Item = u8>) -> u64 {
    bytes.fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> SweepSpec {
        SweepSpec::from_toml(text).unwrap()
    }

    #[test]
    fn expands_the_full_matrix() {
        let s = spec(
            "name='m'\ndatasets=['synthetic:5:10','synthetic:3:10']\nrepeats=2\n[[agents]]\nname='synthetic'\nvariants=['full','no-x']\n",
        );
        let tasks = expand(&s).unwrap();
        assert_eq!(tasks.len(), (5 + 3) * 2 * 2);
        let cells: std::collections::BTreeSet<_> = tasks
            .iter()
            .map(|t| (&t.dataset, &t.instance_id, &t.variant, t.repeat))
            .collect();
        assert_eq!(cells.len(), tasks.len(), "every task is a distinct cell");
        assert_eq!(expand(&s).unwrap().len(), tasks.len());
        assert_eq!(sweep_hash(&s), sweep_hash(&spec(&s.to_toml())));
    }

    #[test]
    fn unknown_dataset_and_wrong_agent_are_named() {
        let e = expand(&spec(
            "name='m'\ndatasets=['nope']\n[[agents]]\nname='synthetic'\n",
        ))
        .unwrap_err();
        assert!(e.0.contains("`nope`"), "{e}");
        let e = expand(&spec(
            "name='m'\ndatasets=['synthetic:2:1']\n[[agents]]\nname='libro'\n",
        ))
        .unwrap_err();
        assert!(e.0.contains("`libro`"), "{e}");
    }
}
