//! A real cluster on this machine: an embedded coordinator on loopback and N `reprobench node`
//! processes of this same binary. `run --local-nodes`, `eval`, `quickstart` and the benchmarks use
//! it; it uses no other module of the binary.

use anyhow::{Context, Result, bail};
use reprobench_coordinator::core::CoreConfig;
use reprobench_coordinator::{Coordinator, ServeConfig};
use reprobench_domain::kind::SlotSpec;
use reprobench_proto::auth::CoordinatorAddress;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Nodes of a local cluster.
#[derive(Debug, Clone)]
pub struct LocalNodes {
    /// How many node processes.
    pub count: u32,
    /// Slots of each.
    pub slots: Vec<SlotSpec>,
    /// Extra `reprobench node` arguments (the node settings, `NodeOptions::node_args`).
    pub args: Vec<String>,
}

/// Number of live nodes a coordinator sees.
pub async fn live_nodes(address: &CoordinatorAddress) -> Result<u32> {
    Ok(address
        .run_client()
        .await?
        .list_runs(reprobench_proto::v1::ListRunsRequest {})
        .await?
        .into_inner()
        .live_nodes)
}

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
            credential_files: Vec::new(),
            max_message_bytes: reprobench_coordinator::server::MAX_MESSAGE_BYTES,
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
            tls_server_name: None,
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
            let live = live_nodes(&self.address).await.unwrap_or(0);
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

    /// Why the embedded coordinator's core stopped on its own, when it does.
    pub fn coordinator_failure(&self) -> Option<reprobench_coordinator::core::CoreFailure> {
        self.coordinator.as_ref().map(|c| c.failure())
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
