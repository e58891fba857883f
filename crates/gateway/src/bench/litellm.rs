//! LiteLLM's proxy as a third arm of the gateway benchmark: the real one (`litellm[proxy]` from
//! PyPI, installed by `tests/litellm_bench.sh`), configured to forward one model name to the same
//! upstream the other arms call, started on a free loopback port for the run and stopped after it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The note a report carries when no LiteLLM command was given.
pub const SKIPPED_NOTE: &str = "LiteLLM arm skipped: no --litellm command given; \
     tests/litellm_bench.sh installs litellm[proxy] from PyPI in a cached virtual environment \
     and runs the benchmark with it (or pass --litellm PATH/TO/litellm)";

/// Environment for the proxy: everything LiteLLM would otherwise fetch from the network at start
/// (the model cost map and other JSON files it reads from GitHub) comes from its own package, and
/// loopback calls never go through an HTTP proxy. Nothing here changes how a call is handled.
pub const OFFLINE_ENV: &[(&str, &str)] = &[
    ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True"),
    ("LITELLM_LOCAL_AUTOROUTER_PRESETS", "True"),
    ("LITELLM_LOCAL_BLOG_POSTS", "True"),
    ("LITELLM_LOCAL_POLICY_TEMPLATES", "True"),
    ("NO_PROXY", "127.0.0.1,localhost"),
    ("no_proxy", "127.0.0.1,localhost"),
];

/// Why the LiteLLM arm could not run.
#[derive(Debug, thiserror::Error)]
pub enum LiteLlmError {
    /// The command is not an executable file.
    #[error(
        "--litellm {0}: no such executable; run tests/litellm_bench.sh, which installs \
         litellm[proxy] from PyPI in a cached virtual environment, or give the path of its \
         bin/litellm"
    )]
    NotFound(PathBuf),
    /// The config file or the log could not be written, or no free port was found.
    #[error("cannot prepare LiteLLM's run: {0}")]
    Io(#[from] std::io::Error),
    /// The process could not be started.
    #[error("cannot start {command}: {source}")]
    Spawn {
        /// The command.
        command: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process ended before it answered its readiness probe.
    #[error("LiteLLM's proxy exited ({status}) before it was ready; the end of its log:\n{log}")]
    Exited {
        /// How it ended.
        status: String,
        /// The last lines it printed.
        log: String,
    },
    /// The readiness probe did not answer in time.
    #[error(
        "LiteLLM's proxy was not ready within {waited:?} (GET /health/readiness); the end of its \
         log:\n{log}"
    )]
    NotReady {
        /// How long it was given.
        waited: Duration,
        /// The last lines it printed.
        log: String,
    },
}

/// LiteLLM's config: `model_name` (what the benchmark's calls ask for) is `upstream_model` at
/// `api_base`, an OpenAI-compatible endpoint; calls must carry `master_key` (LiteLLM refuses to
/// start without one, and checking it is the counterpart of the gateway's virtual key).
pub fn config_yaml(
    model_name: &str,
    upstream_model: &str,
    api_base: &str,
    master_key: &str,
) -> String {
    // JSON strings are valid YAML scalars, so every value is quoted safely.
    let q = |s: &str| serde_json::Value::from(s).to_string();
    format!(
        "# Written by reprobench's gateway benchmark: one OpenAI-compatible deployment, the same\n\
         # upstream the direct and gateway arms call. No database, no cache, no callbacks.\n\
         general_settings:\n  \
           master_key: {}\n\
         model_list:\n  \
           - model_name: {}\n    \
             litellm_params:\n      \
               model: {}\n      \
               api_base: {}\n      \
               api_key: \"none\"\n",
        q(master_key),
        q(model_name),
        q(&format!("openai/{upstream_model}")),
        q(api_base),
    )
}

/// The arguments the proxy is started with.
pub fn proxy_args(config: &Path, port: u16, workers: u32) -> Vec<String> {
    vec![
        "--config".into(),
        config.display().to_string(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
        "--num_workers".into(),
        workers.to_string(),
    ]
}

/// A running LiteLLM proxy in a process group of its own; the group is ended by [`stop`] or, at
/// the latest, when this is dropped (also when the benchmark fails or panics).
///
/// [`stop`]: LiteLlmProxy::stop
pub struct LiteLlmProxy {
    child: Option<tokio::process::Child>,
    /// Holds the config and the log for as long as the proxy runs.
    dir: tempfile::TempDir,
    port: u16,
    master_key: String,
    version: Option<String>,
}

impl LiteLlmProxy {
    /// Writes the config for `upstream_model` at `api_base` under `model_name`, starts `command`
    /// with it on a free loopback port and waits, at most `ready_within`, for its readiness probe.
    pub async fn start(
        command: &Path,
        model_name: &str,
        upstream_model: &str,
        api_base: &str,
        workers: u32,
        ready_within: Duration,
    ) -> Result<LiteLlmProxy, LiteLlmError> {
        if !is_executable(command) {
            return Err(LiteLlmError::NotFound(command.to_path_buf()));
        }
        let dir = tempfile::Builder::new()
            .prefix("reprobench-litellm-")
            .tempdir()?;
        let config = dir.path().join("config.yaml");
        let master_key = format!("sk-{}", reprobench_domain::secret::random_hex(32));
        std::fs::write(
            &config,
            config_yaml(model_name, upstream_model, api_base, &master_key),
        )?;
        let log = std::fs::File::create(dir.path().join("litellm.log"))?;
        // A free port now; the proxy binds it a moment later (nothing else here takes ports).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut cmd = tokio::process::Command::new(command);
        cmd.args(proxy_args(&config, port, workers))
            .envs(OFFLINE_ENV.iter().copied())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| LiteLlmError::Spawn {
            command: command.to_path_buf(),
            source,
        })?;
        let mut proxy = LiteLlmProxy {
            child: Some(child),
            dir,
            port,
            master_key,
            version: None,
        };
        proxy.version = Some(proxy.wait_ready(ready_within).await?).filter(|v| !v.is_empty());
        Ok(proxy)
    }

    /// Polls `GET /health/readiness` until it answers 200, the process exits, or `within` passes;
    /// then its version from `/health/readiness/details` (or `""`).
    async fn wait_ready(&mut self, within: Duration) -> Result<String, LiteLlmError> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| LiteLlmError::Io(std::io::Error::other(e)))?;
        let url = format!("http://127.0.0.1:{}/health/readiness", self.port);
        let start = Instant::now();
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(LiteLlmError::Exited {
                    status: status.to_string(),
                    log: self.log_tail(40),
                });
            }
            if let Ok(response) = client.get(&url).send().await
                && response.status().is_success()
            {
                // The public probe no longer carries the version; the authenticated details do.
                let details = client
                    .get(format!("{url}/details"))
                    .bearer_auth(&self.master_key)
                    .send()
                    .await;
                let body: serde_json::Value = match details {
                    Ok(d) if d.status().is_success() => d.json().await.unwrap_or_default(),
                    _ => response.json().await.unwrap_or_default(),
                };
                let version = body["litellm_version"].as_str().unwrap_or_default();
                return Ok(version.to_string());
            }
            if start.elapsed() >= within {
                return Err(LiteLlmError::NotReady {
                    waited: within,
                    log: self.log_tail(40),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The OpenAI base URL of the proxy, `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// The key calls must carry (`Authorization: Bearer …`).
    pub fn master_key(&self) -> &str {
        &self.master_key
    }

    /// The version its readiness probe reported, if it did.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The process id of the proxy (the leader of its process group), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// The last `lines` lines of what the proxy printed.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("litellm.log")).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Asks the process group to end (SIGTERM: uvicorn stops its workers), and kills it if it has
    /// not ended within 10 s.
    pub async fn stop(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        signal_group(&child, libc::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(10), child.wait())
            .await
            .is_err()
        {
            signal_group(&child, libc::SIGKILL);
            let _ = child.wait().await;
        }
        // A worker that outlived its leader has nothing left to do.
        signal_group(&child, libc::SIGKILL);
    }
}

impl Drop for LiteLlmProxy {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            signal_group(child, libc::SIGKILL);
        }
    }
}

/// Sends `signal` to the process group `child` leads (it was started with `process_group(0)`).
fn signal_group(child: &tokio::process::Child, signal: libc::c_int) {
    if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: killpg only sends a signal; the group is the child's own.
        unsafe { libc::killpg(pid, signal) };
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_maps_the_model_name_to_the_upstream_as_an_openai_endpoint() {
        let yaml = config_yaml("bench", "scripted", "http://127.0.0.1:4242/v1", "sk-0123");
        assert!(yaml.contains("- model_name: \"bench\"\n"), "{yaml}");
        assert!(yaml.contains("model: \"openai/scripted\"\n"), "{yaml}");
        assert!(
            yaml.contains("api_base: \"http://127.0.0.1:4242/v1\"\n"),
            "{yaml}"
        );
        assert!(yaml.contains("api_key: \"none\""), "{yaml}");
        assert!(
            yaml.contains("general_settings:\n  master_key: \"sk-0123\"\n"),
            "{yaml}"
        );
        // Nothing that would make LiteLLM do more than forward: no database, cache or callbacks.
        for absent in ["database_url", "cache", "callbacks", "redis"] {
            assert!(
                !yaml
                    .lines()
                    .any(|l| !l.starts_with('#') && l.contains(absent)),
                "{absent}: {yaml}"
            );
        }
        // Quoting keeps a name with YAML's special characters one string.
        let odd = config_yaml("a: b", "x#y", "http://h/v1", "k");
        assert!(odd.contains("model_name: \"a: b\""), "{odd}");
        assert!(odd.contains("model: \"openai/x#y\""), "{odd}");
    }

    #[test]
    fn the_proxy_listens_on_loopback_with_the_workers_asked_for() {
        let args = proxy_args(Path::new("/tmp/c.yaml"), 4000, 1);
        assert_eq!(
            args.join(" "),
            "--config /tmp/c.yaml --host 127.0.0.1 --port 4000 --num_workers 1"
        );
    }

    #[tokio::test]
    async fn a_missing_command_says_how_to_get_litellm() {
        let err = LiteLlmProxy::start(
            Path::new("/nonexistent/bin/litellm"),
            "bench",
            "bench",
            "http://127.0.0.1:1/v1",
            1,
            Duration::from_secs(1),
        )
        .await
        .err()
        .expect("a missing command is an error");
        let text = err.to_string();
        assert!(text.contains("tests/litellm_bench.sh"), "{text}");
        assert!(SKIPPED_NOTE.contains("tests/litellm_bench.sh"));
    }

    #[tokio::test]
    async fn a_command_that_exits_early_is_reported_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("litellm");
        std::fs::write(
            &script,
            "#!/bin/sh\necho \"no module named litellm: $*\" >&2\nexit 3\n",
        )
        .unwrap();
        make_executable(&script);
        let err = LiteLlmProxy::start(
            &script,
            "bench",
            "bench",
            "http://127.0.0.1:1/v1",
            1,
            Duration::from_secs(60),
        )
        .await
        .err()
        .expect("an exiting command is an error");
        let text = err.to_string();
        assert!(text.contains("exited"), "{text}");
        assert!(text.contains("no module named litellm: --config"), "{text}");
    }

    #[tokio::test]
    async fn a_command_that_never_gets_ready_is_given_up_on_and_ended() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("litellm");
        let pid_file = dir.path().join("pid");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho $$ > {}\nexec sleep 600\n",
                pid_file.display()
            ),
        )
        .unwrap();
        make_executable(&script);
        let err = LiteLlmProxy::start(
            &script,
            "bench",
            "bench",
            "http://127.0.0.1:1/v1",
            1,
            Duration::from_millis(500),
        )
        .await
        .err()
        .expect("a proxy that is never ready is an error");
        assert!(err.to_string().contains("not ready within"), "{err}");
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_gone(pid).await;
    }

    /// A stand-in for `litellm` (not LiteLLM): this test binary, run as the ignored test
    /// [`stand_in_litellm`] by a shell script that passes on its arguments and records its pid.
    fn stand_in_command(dir: &Path) -> (PathBuf, PathBuf) {
        let exe = std::env::current_exe().unwrap();
        let (script, pid_file) = (dir.join("litellm"), dir.join("stand-in.pid"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho $$ > '{}'\nREPROBENCH_STAND_IN_ARGS=\"$*\" exec '{}' --ignored \
                 --exact bench::litellm::tests::stand_in_litellm\n",
                pid_file.display(),
                exe.display()
            ),
        )
        .unwrap();
        make_executable(&script);
        (script, pid_file)
    }

    /// The stand-in's body: reads the config the benchmark wrote, answers the readiness probes,
    /// and forwards chat calls carrying the master key to the config's `api_base`.
    #[tokio::test]
    #[ignore = "a stand-in for LiteLLM's proxy, started by the tests that need one"]
    async fn stand_in_litellm() {
        use axum::Router;
        use axum::http::{HeaderMap, StatusCode, header};
        use axum::routing::{get, post};
        let Ok(args) = std::env::var("REPROBENCH_STAND_IN_ARGS") else {
            return;
        };
        let args: Vec<&str> = args.split(' ').collect();
        let after = |flag: &str| args[args.iter().position(|a| *a == flag).unwrap() + 1];
        let config = std::fs::read_to_string(after("--config")).unwrap();
        let value = |key: &str| -> String {
            let line = config
                .lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .unwrap();
            serde_json::from_str(line.trim()).unwrap()
        };
        let (api_base, key) = (value("api_base:"), value("master_key:"));
        let bearer = format!("Bearer {key}");
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        let details_bearer = bearer.clone();
        let app = Router::new()
            .route(
                "/health/readiness",
                get(|| async { json!({"status": "healthy"}).to_string() }),
            )
            .route(
                "/health/readiness/details",
                get(move |headers: HeaderMap| async move {
                    let ok = headers
                        .get(header::AUTHORIZATION)
                        .is_some_and(|v| v == details_bearer.as_str());
                    if ok {
                        json!({"litellm_version": "stand-in"})
                    } else {
                        json!({})
                    }
                    .to_string()
                }),
            )
            .route(
                "/v1/chat/completions",
                post(
                    move |headers: HeaderMap, body: axum::body::Bytes| async move {
                        if headers
                            .get(header::AUTHORIZATION)
                            .is_none_or(|v| v != bearer.as_str())
                        {
                            return (StatusCode::UNAUTHORIZED, HeaderMap::new(), Vec::new());
                        }
                        let upstream = client
                            .post(format!("{api_base}/chat/completions"))
                            .header(header::CONTENT_TYPE, "application/json")
                            .body(body)
                            .send()
                            .await
                            .unwrap();
                        let status = StatusCode::from_u16(upstream.status().as_u16()).unwrap();
                        let mut out = HeaderMap::new();
                        if let Some(t) = upstream.headers().get(header::CONTENT_TYPE) {
                            out.insert(header::CONTENT_TYPE, t.as_bytes().try_into().unwrap());
                        }
                        (status, out, upstream.bytes().await.unwrap().to_vec())
                    },
                ),
            );
        let listener =
            tokio::net::TcpListener::bind(("127.0.0.1", after("--port").parse().unwrap()))
                .await
                .unwrap();
        axum::serve(listener, app).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_litellm_arm_is_measured_through_the_proxy_and_the_proxy_is_ended() {
        let dir = tempfile::tempdir().unwrap();
        let (command, pid_file) = stand_in_command(dir.path());
        let arm = super::super::LiteLlmArm {
            command,
            workers: 1,
            ready_within: Duration::from_secs(60),
        };
        let report =
            super::super::run_with(super::super::BenchUpstream::Scripted, 10, 2, Some(&arm))
                .await
                .unwrap();
        assert_eq!(report.errors, 0);
        assert!(report.litellm_note.is_none(), "{:?}", report.litellm_note);
        let lite = report.litellm.expect("the LiteLLM arm ran");
        assert_eq!(lite.errors, 0, "{lite:?}");
        assert_eq!(lite.version.as_deref(), Some("stand-in"));
        assert_eq!(lite.workers, 1);
        assert!(
            lite.calls_per_s > 0.0 && lite.p99_ms >= lite.p50_ms,
            "{lite:?}"
        );
        assert_eq!(lite.added_p50_ms, lite.p50_ms - report.direct_p50_ms);
        assert_eq!(
            lite.gateway_over_litellm_calls_per_s,
            report.gateway_calls_per_s / lite.calls_per_s
        );
        // The gateway still metered only its own calls: plain, streamed and concurrent, 10 each.
        assert_eq!(report.gateway_metered_calls, 30);
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_gone(pid).await;
    }

    pub(crate) fn make_executable(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// Waits (deadline 10 s) until no process `pid` exists, or it is a zombie nobody reaped yet.
    pub(crate) async fn wait_gone(pid: i32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let running = state
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'));
            if !running {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "process {pid} still runs: {state}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
