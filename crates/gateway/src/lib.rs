//! The LLM gateway: an OpenAI-compatible metering proxy between agents and backbones.
//!
//! Each task gets a virtual key from [`Gateway::open_task`]; calls made with it are
//! forwarded to the task's backbone (model and sampling parameters rewritten), metered
//! exactly from the upstream's `usage`, checked against the task's budget, retried on
//! transient failures, and recorded in the task's transcript. In replay mode recorded
//! responses are served instead and no upstream is ever called.

pub mod accounting;
pub mod bench;
pub mod llm;
pub mod metrics;
pub mod replay;
pub mod scripted;
mod server;
pub mod sse;
pub mod transcript;
pub mod upstream;

pub use accounting::{Reservation, TaskBudget, TokenCounts, Usage};

use axum::serve::ListenerExt;
use metrics::Metrics;
use replay::ReplayIndex;
use reprobench_domain::sweep::BackboneSpec;
use reprobench_domain::swt::Fnv;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use transcript::{TranscriptWriter, sanitize_task_name};
use upstream::{Upstream, upstream_key};

/// How the gateway runs.
#[derive(Debug, Clone, Default)]
pub struct GatewayConfig {
    /// Directory of transcripts: one `<sanitized task name>.jsonl` per task.
    pub transcripts: Option<PathBuf>,
    /// A transcript file or directory to serve recorded responses from; no upstream is called.
    pub replay: Option<PathBuf>,
    /// Standalone mode: an unknown bearer token becomes its own task with the defaults.
    pub open: bool,
    /// Backbone of tasks created in open mode.
    pub default_backbone: Option<BackboneSpec>,
    /// Budget of tasks created in open mode.
    pub default_budget: TaskBudget,
    /// Retries of transient upstream failures.
    pub retry: RetryPolicy,
    /// What a sweep's backbones may make this gateway do (a node's gateway calls the endpoints a
    /// sweep names with keys from the node's environment); `None`: no limit (the standalone
    /// gateway, whose backbones come from its operator's own file).
    pub upstream_policy: Option<UpstreamPolicy>,
    /// The most output tokens a call may ask for when its task has a tokens or cost budget
    /// (`None`: [`DEFAULT_MAX_OUTPUT_TOKENS`]): calls asking more, or nothing, are given this
    /// limit, which is what an admitted call reserves until its usage is known.
    pub max_output_tokens: Option<u64>,
    /// The bearer key that lets clients on other machines read `/v1/usage` and `/metrics`
    /// (`None`: only this machine's clients may, over loopback).
    pub stats_key: Option<String>,
}

/// See [`GatewayConfig::max_output_tokens`]: the output limit of today's large models.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 32_768;

/// The environment variables a sweep's backbones may read their key from, and the hosts they may
/// reach over plain http (besides this machine). Any https:// host may be named: the key goes
/// to it encrypted, and only keys the node declared can be sent at all.
#[derive(Debug, Clone)]
pub struct UpstreamPolicy {
    /// Who enforces it, for the messages (the node's name).
    pub holder: String,
    /// Variables `api_key_env` may name (`--allow-key-env`).
    pub key_envs: Vec<String>,
    /// Hosts an `http://` base URL may name besides loopback (`--allow-http-host`).
    pub http_hosts: Vec<String>,
}

impl UpstreamPolicy {
    /// Why `backbone` may not be called under this policy, naming the flag that would allow it.
    pub fn refusal(&self, backbone: &BackboneSpec) -> Option<String> {
        let holder = &self.holder;
        if let Some(var) = &backbone.api_key_env
            && !self.key_envs.iter().any(|k| k == var)
        {
            return Some(format!(
                "backbone `{}` reads its API key from ${var}, which {holder} does not let sweeps read: start it with --allow-key-env {var} (a sweep may send a backbone only the keys its node declares)",
                backbone.name
            ));
        }
        let (scheme, rest) = backbone.base_url.split_once("://")?;
        if scheme.eq_ignore_ascii_case("https") {
            return None;
        }
        let host = url_host(rest);
        if is_loopback(host) || self.http_hosts.iter().any(|h| h.eq_ignore_ascii_case(host)) {
            return None;
        }
        Some(format!(
            "backbone `{}` has base_url `{}`: plain http:// to `{host}` would carry requests (and any key) unencrypted; use https://, or start {holder} with --allow-http-host {host}",
            backbone.name, backbone.base_url
        ))
    }
}

/// The host of a URL's part after `scheme://` (no user info, port or path). Pure.
fn url_host(rest: &str) -> &str {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host_port.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default();
    }
    host_port.split(':').next().unwrap_or_default()
}

/// Whether `host` names this machine (`localhost`, 127.0.0.0/8, ::1).
fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Retries with full-jitter exponential backoff.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Ceiling of the first backoff; doubles each retry.
    pub base: Duration,
    /// Largest backoff ceiling.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

/// Why the gateway could not start or open a task.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The listen address is unavailable.
    #[error("cannot listen on {addr}: {source} (choose a free port, or port 0 for any)")]
    Bind {
        /// Address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The backbone's API key variable is unset.
    #[error(
        "backbone `{backbone}` reads its API key from ${var}, which is not set: export {var}=… on the node"
    )]
    MissingApiKey {
        /// Backbone name.
        backbone: String,
        /// Environment variable name.
        var: String,
    },
    /// The node's policy does not let a sweep call this backbone (see [`UpstreamPolicy`]).
    #[error("{0}")]
    NotAllowed(String),
    /// A transcript file cannot be created.
    #[error("cannot open transcript {path}: {source} (check the directory exists and is writable)")]
    Transcript {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The replay source cannot be read.
    #[error(
        "cannot load replay recordings from {path}: {message} (give a transcript .jsonl file or a directory of them)"
    )]
    Replay {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The configuration or a backbone spec is unusable.
    #[error("invalid gateway configuration: {0}")]
    Config(String),
    /// The HTTP client could not be built.
    #[error("cannot build the upstream HTTP client: {0}")]
    Client(String),
}

/// One task's state.
pub(crate) struct Task {
    pub name: String,
    pub backbone: BackboneSpec,
    pub upstream: Arc<Upstream>,
    pub budget: TaskBudget,
    pub opened: Instant,
    pub state: Mutex<TaskState>,
    pub transcript: Option<TranscriptWriter>,
}

/// Mutable per-task counters.
#[derive(Default)]
pub(crate) struct TaskState {
    pub usage: Usage,
    pub in_flight: u64,
    /// The worst cases of the calls in flight (see [`Reservation`]).
    pub reserved: Reservation,
    /// Closed: its usage was handed back and retired; calls still finishing charge the
    /// retired figures too.
    pub closed: bool,
}

/// Closed tasks' usage, kept small: the latest [`RETIRED_NAMES_KEPT`] by name, the rest summed.
#[derive(Default)]
struct Retired {
    /// Every closed task's usage, summed.
    all: Usage,
    by_name: HashMap<String, Usage>,
    /// Names in `by_name`, oldest first.
    order: VecDeque<String>,
    /// Closed tasks no longer listed by name, summed.
    earlier: Usage,
}

/// Closed tasks listed by name in `/v1/usage?per_task=true`; older ones are summed under
/// [`EARLIER_TASKS`]. A node running a long sweep keeps no per-task state beyond this.
pub const RETIRED_NAMES_KEPT: usize = 1024;
/// The name under which closed tasks no longer listed one by one are summed.
pub const EARLIER_TASKS: &str = "(earlier closed tasks)";

impl Retired {
    fn add(&mut self, name: &str, usage: &Usage) {
        self.all.add(usage);
        if let Some(u) = self.by_name.get_mut(name) {
            u.add(usage);
            return;
        }
        self.by_name.insert(name.to_string(), usage.clone());
        self.order.push_back(name.to_string());
        while self.order.len() > RETIRED_NAMES_KEPT {
            if let Some(old) = self.order.pop_front()
                && let Some(u) = self.by_name.remove(&old)
            {
                self.earlier.add(&u);
            }
        }
    }
}

/// State shared by the HTTP handlers and the [`Gateway`] handle.
pub(crate) struct Shared {
    pub config: GatewayConfig,
    client: reqwest::Client,
    keys: Mutex<HashMap<String, Arc<Task>>>,
    /// Closed keys, kept in open mode only (so a closed key does not become a task again).
    closed: Mutex<HashSet<String>>,
    retired: Mutex<Retired>,
    upstreams: Mutex<HashMap<String, Arc<Upstream>>>,
    pub replay: Option<Mutex<ReplayIndex>>,
    pub metrics: Mutex<Metrics>,
}

pub(crate) use reprobench_domain::sync::lock;

impl Shared {
    pub fn is_replay(&self) -> bool {
        self.replay.is_some()
    }

    /// The task a bearer token stands for; in open mode an unknown token becomes a task.
    pub fn task_for_key(&self, token: &str) -> Result<Option<Arc<Task>>, GatewayError> {
        if let Some(task) = lock(&self.keys).get(token) {
            return Ok(Some(task.clone()));
        }
        if !self.config.open || lock(&self.closed).contains(token) {
            return Ok(None);
        }
        let backbone = self
            .config
            .default_backbone
            .clone()
            .ok_or_else(|| GatewayError::Config("open mode needs a default backbone".into()))?;
        let mut h = Fnv::default();
        h.add(token);
        let name = format!("open-{:08x}", h.0 >> 32);
        let task = self.new_task(&name, &backbone, self.config.default_budget.clone(), None)?;
        let mut keys = lock(&self.keys);
        let task = keys.entry(token.to_string()).or_insert(task).clone();
        Ok(Some(task))
    }

    fn new_task(
        &self,
        name: &str,
        backbone: &BackboneSpec,
        budget: TaskBudget,
        transcript: Option<PathBuf>,
    ) -> Result<Arc<Task>, GatewayError> {
        let upstream = self.upstream_for(backbone)?;
        let path = transcript.or_else(|| {
            self.config
                .transcripts
                .as_ref()
                .map(|dir| dir.join(format!("{}.jsonl", sanitize_task_name(name))))
        });
        let transcript = path
            .map(|path| {
                TranscriptWriter::open(&path, upstream.secrets())
                    .map_err(|source| GatewayError::Transcript { path, source })
            })
            .transpose()?;
        let task = Arc::new(Task {
            name: name.to_string(),
            backbone: backbone.clone(),
            upstream,
            budget,
            opened: Instant::now(),
            state: Mutex::new(TaskState {
                usage: Usage {
                    replay: self.is_replay(),
                    ..Usage::default()
                },
                in_flight: 0,
                reserved: Reservation::default(),
                closed: false,
            }),
            transcript,
        });
        Ok(task)
    }

    /// Why the upstream policy refuses `backbone` (never while replaying: nothing is called).
    fn refusal(&self, backbone: &BackboneSpec) -> Option<String> {
        if self.is_replay() {
            return None;
        }
        self.config.upstream_policy.as_ref()?.refusal(backbone)
    }

    fn upstream_for(&self, backbone: &BackboneSpec) -> Result<Arc<Upstream>, GatewayError> {
        if !(backbone.base_url.starts_with("http://") || backbone.base_url.starts_with("https://"))
        {
            return Err(GatewayError::Config(format!(
                "backbone `{}` has base_url `{}`, which is not an http:// or https:// URL",
                backbone.name, backbone.base_url
            )));
        }
        if let Some(why) = self.refusal(backbone) {
            return Err(GatewayError::NotAllowed(why));
        }
        let key = upstream_key(backbone);
        if let Some(upstream) = lock(&self.upstreams).get(&key) {
            return Ok(upstream.clone());
        }
        let api_key = match (&backbone.api_key_env, self.is_replay()) {
            (Some(var), false) => Some(
                std::env::var(var)
                    .ok()
                    .filter(|v| !v.is_empty())
                    .ok_or_else(|| GatewayError::MissingApiKey {
                        backbone: backbone.name.clone(),
                        var: var.clone(),
                    })?,
            ),
            _ => None,
        };
        let upstream = Arc::new(Upstream::new(backbone, api_key, self.client.clone()));
        Ok(lock(&self.upstreams).entry(key).or_insert(upstream).clone())
    }

    /// Names of the backbones known to the gateway, sorted.
    pub fn backbone_names(&self) -> Vec<String> {
        let mut names: Vec<String> = lock(&self.upstreams)
            .values()
            .map(|u| u.spec.name.clone())
            .chain(self.config.default_backbone.iter().map(|b| b.name.clone()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Usage per task name (tasks sharing a name are summed): open tasks, the latest closed
    /// ones, and the earlier closed ones summed under [`EARLIER_TASKS`].
    pub fn usage_by_task(&self) -> BTreeMap<String, Usage> {
        let mut out: BTreeMap<String, Usage> = BTreeMap::new();
        {
            let retired = lock(&self.retired);
            for (name, usage) in &retired.by_name {
                out.entry(name.clone()).or_default().add(usage);
            }
            if retired.earlier != Usage::default() {
                out.insert(EARLIER_TASKS.to_string(), retired.earlier.clone());
            }
        }
        for task in self.open_tasks() {
            let usage = lock(&task.state).usage.clone();
            out.entry(task.name.clone()).or_default().add(&usage);
        }
        out
    }

    /// Usage summed over every task ever opened.
    pub fn totals(&self) -> Usage {
        let mut total = Usage {
            replay: self.is_replay(),
            ..Usage::default()
        };
        total.add(&lock(&self.retired).all);
        for task in self.open_tasks() {
            total.add(&lock(&task.state).usage);
        }
        total
    }

    fn open_tasks(&self) -> Vec<Arc<Task>> {
        lock(&self.keys).values().cloned().collect()
    }

    /// Charges `usage` to task `task`, and to the retired figures when the task is closed.
    pub(crate) fn charge(&self, task: &Task, usage: &Usage) {
        let mut state = lock(&task.state);
        state.usage.add(usage);
        if state.closed {
            lock(&self.retired).add(&task.name, usage);
        }
    }

    /// Open tasks, and closed tasks listed by name (for tests of what a long run retains).
    pub fn retained(&self) -> (usize, usize) {
        (lock(&self.keys).len(), lock(&self.retired).by_name.len())
    }
}

struct Inner {
    shared: Arc<Shared>,
    addr: SocketAddr,
    servers: Mutex<Vec<Server>>,
    /// Addresses of [`Gateway::serve_also`] by IP.
    extra: Mutex<HashMap<IpAddr, SocketAddr>>,
}

/// One listening address of the gateway.
struct Server {
    addr: SocketAddr,
    stop: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(listen: SocketAddr, shared: &Arc<Shared>) -> Result<Server, GatewayError> {
        let bind_error = |source| GatewayError::Bind {
            addr: listen,
            source,
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(bind_error)?;
        let addr = listener.local_addr().map_err(bind_error)?;
        // Without TCP_NODELAY each small write of a relayed stream waited on the client's
        // delayed ACK (about 40 ms a call).
        let listener = listener.tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!("cannot set TCP_NODELAY on a gateway connection: {e}");
            }
        });
        let stop = Arc::new(Notify::new());
        let app = server::router(shared.clone());
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            let serve = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.notified().await });
            if let Err(e) = serve.await {
                tracing::error!("gateway server stopped: {e}");
            }
        });
        Ok(Server { addr, stop, task })
    }
}

/// A running gateway; cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl Gateway {
    /// Starts serving on `listen` (port 0 picks a free port).
    pub async fn start(listen: SocketAddr, config: GatewayConfig) -> Result<Gateway, GatewayError> {
        if config.open && config.default_backbone.is_none() {
            return Err(GatewayError::Config(
                "open mode turns unknown keys into tasks of the default backbone, but none is set"
                    .into(),
            ));
        }
        let replay = config
            .replay
            .as_ref()
            .map(|path| {
                ReplayIndex::load(path).map_err(|e| GatewayError::Replay {
                    path: e.path,
                    message: e.message,
                })
            })
            .transpose()?;
        // reqwest falls back to rustls' ring provider when none is installed, so https
        // upstreams work without process-wide setup.
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(256)
            // Streamed answers are relayed as many small writes: no Nagle delay on either side.
            .tcp_nodelay(true)
            .build()
            .map_err(|e| GatewayError::Client(e.to_string()))?;
        let shared = Arc::new(Shared {
            config,
            client,
            keys: Mutex::new(HashMap::new()),
            closed: Mutex::new(HashSet::new()),
            retired: Mutex::new(Retired::default()),
            upstreams: Mutex::new(HashMap::new()),
            replay: replay.map(Mutex::new),
            metrics: Mutex::new(Metrics::default()),
        });
        if let (Some(backbone), false) = (&shared.config.default_backbone, shared.is_replay()) {
            shared.upstream_for(backbone)?;
        }
        let server = Server::start(listen, &shared).await?;
        Ok(Gateway {
            inner: Arc::new(Inner {
                shared,
                addr: server.addr,
                servers: Mutex::new(vec![server]),
                extra: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Serves the same tasks on `ip` as well (a free port), for clients that cannot reach the
    /// main address, such as agent containers on a network of their own. Returns the address;
    /// asking again for the same `ip` returns the same one.
    pub async fn serve_also(&self, ip: IpAddr) -> Result<SocketAddr, GatewayError> {
        if let Some(addr) = lock(&self.inner.extra).get(&ip) {
            return Ok(*addr);
        }
        let server = Server::start(SocketAddr::new(ip, 0), &self.inner.shared).await?;
        let addr = server.addr;
        let mut extra = lock(&self.inner.extra);
        if let Some(first) = extra.get(&ip) {
            // Another caller bound it meanwhile: keep theirs.
            server.stop.notify_one();
            return Ok(*first);
        }
        extra.insert(ip, addr);
        lock(&self.inner.servers).push(server);
        Ok(addr)
    }

    /// Why this gateway would refuse to call `backbone` (its [`UpstreamPolicy`]), before any
    /// task is opened; `None` when it would call it (or only replays).
    pub fn refusal(&self, backbone: &BackboneSpec) -> Option<String> {
        self.inner.shared.refusal(backbone)
    }

    /// The OpenAI base URL agents use, `http://IP:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.inner.addr)
    }

    /// The address served.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Opens a task: returns the virtual key its agent must send as `Bearer` token.
    /// `transcript` overrides the file in the configured transcript directory.
    pub fn open_task(
        &self,
        task: &str,
        backbone: &BackboneSpec,
        budget: TaskBudget,
        transcript: Option<PathBuf>,
    ) -> Result<String, GatewayError> {
        let shared = &self.inner.shared;
        let task = shared.new_task(task, backbone, budget, transcript)?;
        let key = new_virtual_key();
        lock(&shared.keys).insert(key.clone(), task);
        Ok(key)
    }

    /// What the task with this key has used so far.
    pub fn task_usage(&self, key: &str) -> Option<Usage> {
        let task = lock(&self.inner.shared.keys).get(key).cloned()?;
        let usage = lock(&task.state).usage.clone();
        Some(usage)
    }

    /// Closes a task: its key is refused from now on. Returns its final usage.
    pub fn close_task(&self, key: &str) -> Option<Usage> {
        let shared = &self.inner.shared;
        let task = lock(&shared.keys).remove(key)?;
        if shared.config.open {
            lock(&shared.closed).insert(key.to_string());
        }
        let usage = {
            let mut state = lock(&task.state);
            state.closed = true;
            lock(&shared.retired).add(&task.name, &state.usage);
            state.usage.clone()
        };
        // The task's transcript file closes when its last call in flight ends.
        Some(usage)
    }

    /// Open tasks, and closed tasks still listed by name: what the gateway retains.
    pub fn retained_tasks(&self) -> (usize, usize) {
        self.inner.shared.retained()
    }

    /// Usage summed over every task, open or closed.
    pub fn totals(&self) -> Usage {
        self.inner.shared.totals()
    }

    /// True when serving recorded responses.
    pub fn is_replay(&self) -> bool {
        self.inner.shared.is_replay()
    }

    /// Stops accepting connections and waits (up to 10 s) for calls in progress.
    pub async fn shutdown(self) {
        let servers = std::mem::take(&mut *lock(&self.inner.servers));
        for server in &servers {
            server.stop.notify_one();
        }
        let all = futures_util::future::join_all(servers.into_iter().map(|s| s.task));
        if tokio::time::timeout(Duration::from_secs(10), all)
            .await
            .is_err()
        {
            tracing::warn!("gateway calls still running 10 s after shutdown; abandoning them");
        }
    }
}

/// A fresh unguessable virtual key, `rb-` and 32 hex digits (panics when the OS's random number
/// generator fails: a key derived from anything else could be guessed).
fn new_virtual_key() -> String {
    format!("rb-{}", reprobench_domain::secret::random_hex(16))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backbone(base_url: &str, key: Option<&str>) -> BackboneSpec {
        toml::from_str::<BackboneSpec>(&format!(
            "name = \"b\"\nbase_url = \"{base_url}\"\nmodel = \"m\"\n{}",
            key.map(|k| format!("api_key_env = \"{k}\"\n"))
                .unwrap_or_default()
        ))
        .unwrap()
    }

    #[test]
    fn a_policy_lets_through_declared_keys_https_and_loopback_only() {
        let policy = UpstreamPolicy {
            holder: "node-1".into(),
            key_envs: vec!["OPENAI_API_KEY".into()],
            http_hosts: vec!["vllm.lab".into()],
        };
        for ok in [
            backbone("https://api.example.com/v1", Some("OPENAI_API_KEY")),
            backbone("http://127.0.0.1:8000/v1", None),
            backbone("http://localhost/v1", None),
            backbone("http://[::1]:9/v1", None),
            backbone("http://VLLM.lab:8000/v1", None),
            backbone("https://elsewhere/v1", None),
        ] {
            assert_eq!(policy.refusal(&ok), None, "{}", ok.base_url);
        }
        let undeclared = policy
            .refusal(&backbone("https://api.example.com/v1", Some("AWS_SECRET")))
            .unwrap();
        assert!(
            undeclared.contains("--allow-key-env AWS_SECRET"),
            "{undeclared}"
        );
        for (url, host) in [
            ("http://elsewhere.example/v1", "elsewhere.example"),
            ("http://user@10.0.0.5:80/v1", "10.0.0.5"),
            ("http://127.0.0.1.evil.example/v1", "127.0.0.1.evil.example"),
        ] {
            let why = policy.refusal(&backbone(url, None)).unwrap();
            assert!(why.contains(&format!("--allow-http-host {host}")), "{why}");
        }
    }
}
