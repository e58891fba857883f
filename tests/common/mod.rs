//! Helpers for integration tests that start real `reprobench` processes on loopback.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Whether the Docker engine and the docker executor's base image are here; with
/// `REPROBENCH_REQUIRE_DOCKER=1` (set by `.ci/run`) their absence fails the test instead.
pub fn docker_ready() -> bool {
    let ok = Command::new("docker")
        .args(["image", "inspect", "reprobench/python-base:bookworm-2"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("REPROBENCH_REQUIRE_DOCKER").as_deref() != Ok("1"),
            "REPROBENCH_REQUIRE_DOCKER=1 but the Docker engine or the base image is missing: run `reprobench images bootstrap`"
        );
        eprintln!(
            "skipped: no Docker engine or no reprobench/python-base:bookworm-2 image (`reprobench images bootstrap` builds it)"
        );
    }
    ok
}

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_reprobench")
}

/// Polls `f` until it returns `Some`, or panics after `within` with `what` and the cluster's logs.
pub fn poll<T>(
    within: Duration,
    what: &str,
    logs: impl Fn() -> String,
    mut f: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {within:?} waiting for {what}\n--- logs ---\n{}",
                logs()
            );
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A coordinator and nodes started as separate processes, killed when dropped.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub serve: Option<Child>,
    pub nodes: Vec<(String, Child)>,
    pub url: String,
    pub listen: String,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    /// Extra arguments for `serve` (TLS).
    pub serve_args: Vec<String>,
    /// Extra arguments for nodes and clients (TLS CA).
    pub client_args: Vec<String>,
}

impl Cluster {
    /// Starts `serve` on a free loopback port with the given lease timing.
    pub fn start(lease_ms: u64, heartbeat_ms: u64) -> Cluster {
        Cluster::start_with(
            tempfile::tempdir().expect("temp dir"),
            lease_ms,
            heartbeat_ms,
            vec![],
            vec![],
        )
    }

    /// Starts `serve` in `dir` with extra serve and client arguments.
    pub fn start_with(
        dir: tempfile::TempDir,
        lease_ms: u64,
        heartbeat_ms: u64,
        serve_args: Vec<String>,
        client_args: Vec<String>,
    ) -> Cluster {
        let mut c = Cluster {
            dir,
            serve: None,
            nodes: Vec::new(),
            url: String::new(),
            listen: "127.0.0.1:0".into(),
            lease_ms,
            heartbeat_ms,
            serve_args,
            client_args,
        };
        c.start_serve();
        c
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn token_file(&self) -> PathBuf {
        self.data().join("token")
    }

    fn log(&self, name: &str) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("log file")
    }

    /// (Re)starts the coordinator on the same data dir and address.
    pub fn start_serve(&mut self) {
        let address_file = self.data().join("serve.json");
        let _ = std::fs::remove_file(&address_file);
        let child = Command::new(bin())
            .args(["serve", "--data"])
            .arg(self.data())
            .args(["--listen", &self.listen])
            .args([
                "--lease-ms",
                &self.lease_ms.to_string(),
                "--heartbeat-ms",
                &self.heartbeat_ms.to_string(),
            ])
            .args(&self.serve_args)
            .stdin(Stdio::null())
            .stdout(self.log("serve"))
            .stderr(self.log("serve"))
            .spawn()
            .expect("start serve");
        self.serve = Some(child);
        let url = poll(
            Duration::from_secs(20),
            "serve.json",
            || self.logs(),
            || {
                let text = std::fs::read_to_string(&address_file).ok()?;
                let v: Value = serde_json::from_str(&text).ok()?;
                v["url"].as_str().map(str::to_string)
            },
        );
        self.listen = url.split("://").nth(1).unwrap_or(&url).to_string();
        self.url = url;
    }

    /// Kills the coordinator with SIGKILL and reaps it.
    pub fn kill_serve(&mut self) {
        let mut c = self.serve.take().expect("serve running");
        c.kill().expect("kill serve");
        c.wait().expect("reap serve");
    }

    /// Starts a node process.
    pub fn start_node(&mut self, name: &str, slots: &str) {
        self.start_node_with(name, slots, &[], &[]);
    }

    /// Starts a node process with more arguments and environment variables.
    pub fn start_node_with(
        &mut self,
        name: &str,
        slots: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) {
        self.start_node_presenting(name, slots, &self.token_file(), args, env);
    }

    /// Starts a node process that presents the credential in `token_file`.
    pub fn start_node_presenting(
        &mut self,
        name: &str,
        slots: &str,
        token_file: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) {
        let child = Command::new(bin())
            .args(["node", "--coordinator", &self.url, "--token-file"])
            .arg(token_file)
            .args(["--slots", slots, "--name", name, "--drain-timeout-s", "30"])
            .args(&self.client_args)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(self.log(name))
            .stderr(self.log(name))
            .spawn()
            .expect("start node");
        self.nodes.push((name.to_string(), child));
    }

    pub fn node_pid(&self, name: &str) -> i32 {
        self.nodes
            .iter()
            .find(|(n, _)| n == name)
            .expect("node")
            .1
            .id() as i32
    }

    pub fn node_mut(&mut self, name: &str) -> &mut Child {
        &mut self
            .nodes
            .iter_mut()
            .find(|(n, _)| n == name)
            .expect("node")
            .1
    }

    /// Runs a CLI command and returns its output.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run cli")
    }

    /// Writes a sweep file and submits it detached; returns the run id.
    pub fn submit(&self, dataset: &str) -> String {
        self.submit_sweep(
            &format!("sweep-{}", dataset.replace(':', "_")),
            &format!("name = \"test\"\ndatasets = [\"{dataset}\"]\nseed = 3\n[[agents]]\nname = \"synthetic\"\n"),
        )
    }

    /// Writes `toml` to `NAME.toml` and submits it detached; returns the run id.
    pub fn submit_sweep(&self, name: &str, toml: &str) -> String {
        let sweep = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&sweep, toml).unwrap();
        let token = self.token_file();
        let out = self.cli(
            &[
                "run",
                sweep.to_str().unwrap(),
                "--coordinator",
                &self.url,
                "--token-file",
                token.to_str().unwrap(),
                "--detach",
                "--json",
            ]
            .into_iter()
            .chain(self.client_args.iter().map(String::as_str))
            .collect::<Vec<_>>(),
        );
        assert!(
            out.status.success(),
            "submit failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs()
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("submit json");
        v["run_id"].as_str().unwrap().to_string()
    }

    /// `status RUN --attempts --json` read from the store.
    pub fn status(&self, run: &str) -> Value {
        let data = self.data();
        let out = self.cli(&[
            "status",
            run,
            "--attempts",
            "--json",
            "--data",
            data.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("status json")
    }

    /// `status` asked of the live coordinator over the protocol (not read from the store):
    /// RUN's as JSON with `Some(run)`, else the text listing.
    pub fn live_status(&self, run: Option<&str>) -> String {
        let token = self.token_file();
        let mut args = vec!["status"];
        args.extend(run.iter().flat_map(|r| [*r, "--json"]));
        args.extend(["--coordinator", &self.url, "--token-file"]);
        args.push(token.to_str().unwrap());
        args.extend(self.client_args.iter().map(String::as_str));
        let out = self.cli(&args);
        assert!(
            out.status.success(),
            "status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn done(status: &Value) -> u64 {
        ["succeeded", "failed", "errored"]
            .iter()
            .map(|k| status[k].as_u64().unwrap())
            .sum()
    }

    /// Waits until the run is no longer running.
    pub fn wait_finished(&self, run: &str, within: Duration) -> Value {
        poll(
            within,
            "the run to finish",
            || self.logs(),
            || {
                let s = self.status(run);
                (s["state"] != "running").then_some(s)
            },
        )
    }

    /// Result rows (JSONL export from the store).
    pub fn results(&self, run: &str) -> Vec<Value> {
        results_in(&self.data(), run)
    }

    /// All process logs, for failure messages.
    pub fn logs(&self) -> String {
        logs_in(self.dir.path())
    }
}

/// The tails of the `*.log` files in a directory.
pub fn logs_in(dir: &Path) -> String {
    {
        let mut s = String::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(40).collect();
                    s.push_str(&format!(
                        "== {}\n{}\n",
                        p.display(),
                        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                    ));
                }
            }
        }
        s
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for (_, c) in &mut self.nodes {
            send(c.id() as i32, libc::SIGCONT);
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(c) = &mut self.serve {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sends a signal to a process.
pub fn send(pid: i32, sig: i32) {
    // SAFETY: signalling a child process of this test.
    unsafe { libc::kill(pid, sig) };
}

/// Exactly one result row per (instance, repeat) and `n` of them.
pub fn assert_one_result_per_task(rows: &[Value], n: usize) {
    let keys: std::collections::BTreeSet<(String, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["instance_id"].as_str().unwrap().to_string(),
                r["repeat"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), n, "result rows");
    assert_eq!(keys.len(), n, "distinct tasks among the result rows");
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `../shared/data/SUB` beside the checkout; `None` (after saying so) when it is absent, and a
/// failure instead when `REPROBENCH_REQUIRE_SHARED=1` (CI).
pub fn shared_data(sub: &str) -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data")
        .join(sub);
    if dir.exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("REPROBENCH_REQUIRE_SHARED").as_deref() != Ok("1"),
        "REPROBENCH_REQUIRE_SHARED=1 but {} is absent",
        dir.display()
    );
    eprintln!("skipped: {} is absent", dir.display());
    None
}

/// A run's result rows, exported as JSON lines from the store in `data`.
pub fn results_in(data: &Path, run: &str) -> Vec<Value> {
    let out = Command::new(bin())
        .args(["results", run, "--format", "jsonl", "--data"])
        .arg(data)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "results failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A sweep run to its end with `reprobench run --local-nodes N --json`.
pub struct LocalRun {
    /// The run's store (`--data`).
    pub data: PathBuf,
    /// Where its executors wrote files (`--artifacts`).
    pub artifacts: PathBuf,
    /// What `--json` printed.
    pub summary: Value,
}

impl LocalRun {
    /// Writes `toml` to `dir/NAME.toml` and runs it on `nodes` local nodes from the repository's
    /// root (so bundled datasets are found), with its data and artifacts in `dir` and `extra`
    /// arguments; the test fails with the run's stderr if the run does.
    pub fn start(dir: &Path, name: &str, toml: &str, nodes: u32, extra: &[&str]) -> LocalRun {
        LocalRun::start_with_env(dir, name, toml, nodes, extra, &[])
    }

    /// [`LocalRun::start`] with `env` set for the run (and its local nodes).
    pub fn start_with_env(
        dir: &Path,
        name: &str,
        toml: &str,
        nodes: u32,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> LocalRun {
        let sweep = dir.join(format!("{name}.toml"));
        std::fs::write(&sweep, toml).unwrap();
        let (data, artifacts) = (dir.join("data"), dir.join("artifacts"));
        let out = Command::new(bin())
            .arg("run")
            .arg(&sweep)
            .args(["--local-nodes", &nodes.to_string(), "--json", "--data"])
            .arg(&data)
            .arg("--artifacts")
            .arg(&artifacts)
            .args(extra)
            .envs(env.iter().copied())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "run {name} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        LocalRun {
            data,
            artifacts,
            summary,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &str {
        self.summary["run_id"].as_str().expect("a run id")
    }

    /// The run's result rows.
    pub fn rows(&self) -> Vec<Value> {
        results_in(&self.data, self.run_id())
    }
}
