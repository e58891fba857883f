//! `reprobench quickstart`: swt-mini evaluated SWT-bench style and android-sim on simulated
//! devices, on a local cluster, with summary tables.

use crate::local::LocalNodes;
use anyhow::Result;
use reprobench_domain::kind::SlotSpec;
use std::path::Path;

/// The android part of quickstart: `android-sim` with `gold-trace` and `monkey` on `sim` slots,
/// and `ltgdroid` when a backbone is configured.
async fn quickstart_android(
    data: &Path,
    node: &crate::NodeOptions,
    nodes: u32,
    json: bool,
    backbone: Option<reprobench_domain::sweep::BackboneSpec>,
) -> Result<crate::client::Finished> {
    let datasets_dir = reprobench_domain::swt::default_datasets_dir();
    let mut spec = reprobench_domain::sweep::SweepSpec::from_toml(
        "name = \"quickstart-android\"\ndatasets = [\"android-sim\"]\n[[agents]]\nname = \"gold-trace\"\n[[agents]]\nname = \"monkey\"\n",
    )?;
    if let Some(b) = backbone {
        let mut ltgdroid = spec.agents[0].clone();
        ltgdroid.name = "ltgdroid".into();
        spec.agents.push(ltgdroid);
        spec.backbones.push(b);
    }
    let (attachments, _) = crate::datasets::attach(&spec, &datasets_dir, Path::new("."))?;
    let req = reprobench_proto::v1::SubmitRunRequest {
        sweep_toml: spec.to_toml(),
        resume_existing: true,
        attachments: attachments.into_iter().collect(),
        reuse_finished: false,
    };
    let local = LocalNodes {
        count: nodes,
        slots: vec![SlotSpec {
            kind: reprobench_domain::registry::ExecutorKind::Sim,
            slots: 2,
        }],
        args: node.node_args(),
    };
    crate::client::run_local(data, &local, req, json).await
}

/// The backbone quickstart uses, from `REPROBENCH_BASE_URL`, `REPROBENCH_MODEL` and
/// `REPROBENCH_API_KEY` (or `OPENAI_API_KEY`); `None` when no endpoint is configured.
pub fn backbone_from_env() -> Option<reprobench_domain::sweep::BackboneSpec> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let key_env = ["REPROBENCH_API_KEY", "OPENAI_API_KEY"]
        .into_iter()
        .find(|k| var(k).is_some());
    let base_url = var("REPROBENCH_BASE_URL").or_else(|| {
        key_env
            .filter(|k| *k == "OPENAI_API_KEY")
            .map(|_| "https://api.openai.com/v1".to_string())
    })?;
    let model = var("REPROBENCH_MODEL").unwrap_or_else(|| "gpt-4.1-mini".into());
    Some(reprobench_domain::sweep::BackboneSpec {
        name: model.clone(),
        base_url,
        model,
        api_key_env: key_env.map(str::to_string),
        price: Default::default(),
        params: Default::default(),
        max_concurrency: None,
        requests_per_minute: None,
        timeout_s: None,
        text_only: false,
    })
}

/// `reprobench quickstart`: swt-mini evaluated with the `gold` and `issue-snippet` agents (and
/// `reproagent` and `zero-shot-plus` when a backbone is configured) on a local cluster (docker
/// when the engine and base image are there, else the process executor), then android-sim with
/// `gold-trace` and `monkey` (and `ltgdroid` with a backbone) on simulated devices.
pub async fn quickstart(data: &Path, nodes: u32, json: bool) -> Result<()> {
    let node = crate::NodeOptions::defaults();
    let datasets_dir = reprobench_domain::swt::default_datasets_dir();
    let ds = crate::datasets::load("swt-mini", &datasets_dir, Path::new("."), None)?;
    crate::datasets::ensure_mirrors(&ds, &node.settings().repos)?;
    let executor = crate::eval::auto_executor(&node, json).await;
    let backbone = backbone_from_env();
    if !json {
        eprintln!(
            "quickstart: swt-mini ({} instances in 4 small Python projects) evaluated SWT-bench style with two agents that need no LLM:\n\
             `gold` (the golden test patch) and `issue-snippet` (the issue's code blocks turned into a test), on {nodes} local node processes\n\
             with the {executor} executor. Data: {}\n",
            ds.instances.len(),
            data.display()
        );
        match &backbone {
            Some(b) => eprintln!(
                "A backbone is configured ({} at {}): `reproagent` and `zero-shot-plus` (swt-mini) and `ltgdroid` (android-sim) run too, through each node's metering gateway.\n",
                b.model, b.base_url
            ),
            None => eprintln!(
                "To also run the LLM agents `reproagent`, `zero-shot-plus` and `ltgdroid`, set REPROBENCH_BASE_URL, REPROBENCH_MODEL and REPROBENCH_API_KEY (or OPENAI_API_KEY) for any OpenAI-compatible endpoint.\n"
            ),
        }
    }
    let mut agents = vec!["gold", "issue-snippet"];
    if backbone.is_some() {
        agents.extend(["reproagent", "zero-shot-plus"]);
    }
    let spec = reprobench_domain::sweep::SweepSpec {
        name: "quickstart".into(),
        datasets: vec!["swt-mini".into()],
        repeats: 1,
        seed: 0,
        max_attempts: 3,
        agents: agents
            .into_iter()
            .map(|a| reprobench_domain::sweep::AgentSpec {
                name: a.into(),
                variants: vec!["full".into()],
                predictions: None,
                command: None,
                image: None,
            })
            .collect(),
        backbones: backbone.into_iter().collect(),
        budget: Default::default(),
        eval: reprobench_domain::sweep::EvalSettings {
            executor,
            timeout_s: 300,
            ..Default::default()
        },
    };
    let mut attachments = std::collections::HashMap::new();
    attachments.insert(
        reprobench_coordinator::sweep::dataset_key("swt-mini"),
        crate::datasets::rows_jsonl(&ds),
    );
    let req = reprobench_proto::v1::SubmitRunRequest {
        sweep_toml: spec.to_toml(),
        resume_existing: true,
        attachments,
        reuse_finished: false,
    };
    let local = LocalNodes {
        count: nodes,
        slots: vec![SlotSpec {
            kind: executor,
            slots: 2,
        }],
        args: node.node_args(),
    };
    let done = crate::client::run_local(data, &local, req, json).await?;
    let android = quickstart_android(data, &node, nodes, json, backbone_from_env()).await?;
    if json {
        let mut v = crate::client::finished_json(&done);
        v["android"] = crate::client::finished_json(&android);
        println!("{v}");
    } else {
        crate::client::report(&done, false);
        println!(
            "\nandroid-sim on simulated devices (self-made apps; not an emulator): `gold-trace` replays each report's ground truth, `monkey` acts at random with a fixed seed{}",
            if backbone_from_env().is_some() {
                ", `ltgdroid` explores with the configured backbone"
            } else {
                ""
            }
        );
        crate::client::report(&android, false);
    }
    if !json {
        println!(
            "\nNext: `reprobench results {} --data {} --format csv`; evaluate your own predictions with\n`reprobench eval --dataset swt-mini --predictions preds.jsonl --local-nodes 2`.",
            done.summary.run_id,
            data.display()
        );
    }
    Ok(())
}
