//! A real cluster on this machine: an embedded coordinator on loopback and N `reprobench node`
//! processes of this same binary. `run --local-nodes`, `quickstart` and the benchmarks use it.

use crate::client::LocalNodes;
use anyhow::{Context, Result, bail};
use reprobench_coordinator::core::CoreConfig;
use reprobench_coordinator::{Coordinator, ServeConfig};
use reprobench_proto::auth::CoordinatorAddress;
use reprobench_proto::kind::SlotSpec;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// An embedded coordinator and its node processes.
pub struct LocalCluster {
    coordinator: Option<Coordinator>,
    nodes: Vec<Child>,
    /// How clients reach the coordinator.
    pub address: CoordinatorAddress,
    /// Where node logs go.
    pub log_dir: PathBuf,
}

impl LocalCluster {
    /// Starts the coordinator on `data_dir` and `nodes` node processes with `slots` each.
    pub async fn start(
        data_dir: &Path,
        local: &LocalNodes,
        core: CoreConfig,
    ) -> Result<LocalCluster> {
        let (nodes, slots) = (local.count, &local.slots);
        if nodes == 0 {
            bail!("--local-nodes must be at least 1");
        }
        let cfg = ServeConfig {
            data_dir: data_dir.to_path_buf(),
            listen: "127.0.0.1:0".parse().expect("literal address"),
            token_file: None,
            tls: None,
            core,
        };
        let coordinator = reprobench_coordinator::start(cfg)
            .await
            .context("starting the embedded coordinator")?;
        let url = format!("http://{}", coordinator.addr);
        let log_dir = data_dir.join("logs");
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let exe = std::env::current_exe().context("finding this binary to start node processes")?;
        let mut children = Vec::new();
        let session = reprobench_coordinator::random_hex(2);
        for i in 0..nodes {
            let log_path = log_dir.join(format!("node-{i}.log"));
            let log = std::fs::File::create(&log_path)
                .with_context(|| format!("creating {}", log_path.display()))?;
            let mut cmd = std::process::Command::new(&exe);
            cmd.arg("node")
                .arg("--coordinator")
                .arg(&url)
                .arg("--token-file")
                .arg(&coordinator.token_file)
                .arg("--name")
                .arg(format!("local-{i}-{session}"))
                .arg("--drain-timeout-s")
                .arg("5");
            for s in slots {
                cmd.arg("--slots").arg(format!("{}={}", s.kind, s.slots));
            }
            cmd.args(&local.args);
            cmd.stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            // SAFETY: prctl is async-signal-safe; the node dies with its parent instead of lingering.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
            children.push(cmd.spawn().context("starting a node process")?);
        }
        let address = CoordinatorAddress {
            url,
            token: coordinator.token.clone(),
            tls_ca: None,
        };
        Ok(LocalCluster {
            coordinator: Some(coordinator),
            nodes: children,
            address,
            log_dir,
        })
    }

    /// Waits until `n` nodes are live (polls the coordinator with a deadline).
    pub async fn wait_for_nodes(&mut self, n: u32, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let live = crate::client::live_nodes(&self.address).await.unwrap_or(0);
            if live >= n {
                return Ok(());
            }
            for child in &mut self.nodes {
                if let Ok(Some(status)) = child.try_wait() {
                    bail!(
                        "a node process exited early ({status}); see the logs in {}",
                        self.log_dir.display()
                    );
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "only {live} of {n} nodes joined within {within:?}; see the logs in {}",
                    self.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// When every node process has exited: which exit status and the last lines of its log.
    pub fn all_nodes_exited(&mut self) -> Option<String> {
        let mut last = None;
        for (i, child) in self.nodes.iter_mut().enumerate() {
            match child.try_wait() {
                Ok(Some(status)) => last = Some((i, status)),
                _ => return None,
            }
        }
        let (i, status) = last?;
        let log_path = self.log_dir.join(format!("node-{i}.log"));
        let log = strip_ansi(&std::fs::read_to_string(&log_path).unwrap_or_default());
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        Some(format!(
            "every node process exited ({status}), so no task can run; the run is kept: fix what the node says and run the same command again to resume it. The end of {}:\n{}",
            log_path.display(),
            tail.join("\n")
        ))
    }

    /// Stops the nodes (SIGTERM, then SIGKILL after a grace period) and the coordinator.
    pub async fn stop(mut self) {
        self.stop_nodes().await;
        if let Some(c) = self.coordinator.take() {
            c.shutdown().await;
        }
    }

    async fn stop_nodes(&mut self) {
        for child in &self.nodes {
            // SAFETY: signalling a child process we started and have not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for child in &mut self.nodes {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.nodes.clear();
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Text without terminal colour sequences (`ESC [ ... letter`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The android part of quickstart: `android-sim` with `gold-trace` and `monkey` on `sim` slots,
/// and `ltgdroid` when a backbone is configured.
async fn quickstart_android(
    data: &Path,
    node: &crate::SwtNodeArgs,
    nodes: u32,
    json: bool,
    backbone: Option<reprobench_proto::sweep::BackboneSpec>,
) -> Result<crate::client::Finished> {
    let datasets_dir = reprobench_proto::swt::default_datasets_dir();
    let mut spec = reprobench_proto::sweep::SweepSpec::from_toml(
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
            kind: "sim".into(),
            slots: 2,
        }],
        args: node.node_args(),
    };
    crate::client::run_local(data, &local, req, json).await
}

/// The backbone quickstart uses, from `REPROBENCH_BASE_URL`, `REPROBENCH_MODEL` and
/// `REPROBENCH_API_KEY` (or `OPENAI_API_KEY`); `None` when no endpoint is configured.
pub fn backbone_from_env() -> Option<reprobench_proto::sweep::BackboneSpec> {
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
    Some(reprobench_proto::sweep::BackboneSpec {
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
    let node = crate::SwtNodeArgs::defaults();
    let datasets_dir = reprobench_proto::swt::default_datasets_dir();
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
    let spec = reprobench_proto::sweep::SweepSpec {
        name: "quickstart".into(),
        datasets: vec!["swt-mini".into()],
        repeats: 1,
        seed: 0,
        max_attempts: 3,
        agents: agents
            .into_iter()
            .map(|a| reprobench_proto::sweep::AgentSpec {
                name: a.into(),
                variants: vec!["full".into()],
                predictions: None,
                command: None,
                image: None,
            })
            .collect(),
        backbones: backbone.into_iter().collect(),
        budget: Default::default(),
        eval: reprobench_proto::sweep::EvalSettings {
            executor: executor.clone(),
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
