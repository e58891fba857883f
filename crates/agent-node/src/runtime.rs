//! The node runtime: one event loop that keeps a connection to the coordinator (reconnecting
//! with backoff), runs granted attempts up to its slots, heartbeats whether busy or not, keeps
//! every finished result until the coordinator acknowledges it, stops work whose lease it has
//! lost, and drains on request.

use crate::attempt::{self, Action, AttemptEvent, AttemptState};
use crate::swt_executor::SwtExecutor;
use crate::synthetic::SyntheticExecutor;
use reprobench_domain::kind::SlotSpec;
use reprobench_domain::registry::ExecutorKind;
use reprobench_executor::{AttemptContext, AttemptEnd, AttemptSpec, Executor, FailureClass};
use reprobench_gateway::{Gateway, GatewayConfig, UpstreamPolicy};
use reprobench_proto::auth::{ClientError, CoordinatorAddress, error_chain};
use reprobench_proto::v1::node_service_client::NodeServiceClient;
use reprobench_proto::v1::{
    AttemptProgress, AttemptRef, AttemptResult, Credit, Draining, HandBack, Heartbeat, Hello,
    NodeMessage, RegisterRequest, SlotCount, coordinator_message, node_message,
};
use reprobench_sandbox::docker::{DockerConfig, DockerSandbox};
use reprobench_sandbox::process::ProcessSandbox;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tracing::Instrument;

/// How to run a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The coordinator to join.
    pub coordinator: CoordinatorAddress,
    /// This node's id, stable across reconnects.
    pub node_id: String,
    /// Slots per executor kind.
    pub slots: Vec<SlotSpec>,
    /// How long a drain waits for running attempts before handing them back.
    pub drain_timeout: Duration,
    /// Longest wait between reconnection tries.
    pub max_backoff: Duration,
    /// Where SWT executors find mirrors and keep caches and artifacts.
    pub swt: SwtSettings,
}

/// Settings of the SWT executors (`docker`, `process`).
/// Serialized, it is the typed value `run`, `eval` and `quickstart` hand their local nodes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SwtSettings {
    /// Directory of bare mirrors `OWNER__NAME.git`.
    pub repos: PathBuf,
    /// Cache of gold/base executions and of process-sandbox environments.
    pub cache_dir: PathBuf,
    /// Where each attempt's files (test patch, logs, report) go.
    pub artifacts: PathBuf,
    /// Docker sandbox settings.
    pub docker: DockerConfig,
    /// Replay recorded LLM transcripts (a file or directory) instead of calling backbones.
    pub replay: Option<PathBuf>,
    /// The `android-sim` suite (apps and reports) the `sim` executor runs.
    pub android_sim: PathBuf,
    /// Factor on the simulator's latency model (0: instant; 1: the emulator-like defaults).
    pub sim_latency_scale: f64,
    /// Device replicas ltgdroid pre-assesses candidate actions on (K).
    pub preassess_replicas: usize,
    /// The `emulator` executor's settings; `None` when no AVD was given (`--avd`).
    pub emulator: Option<reprobench_android::emulator::EmulatorSettings>,
    /// Run process executions this node cannot isolate (no network namespace, limits not
    /// set) instead of refusing them; every report then says so.
    pub allow_unisolated_process: bool,
    /// When the process and docker executors stage the next execution's tree while one runs
    /// (`--stage-ahead`; on docker it is staged in the container booted ahead).
    #[serde(default)]
    pub stage_ahead: reprobench_sandbox::StageAheadMode,
    /// Announce the first execution of the task the coordinator names as this node's next
    /// while the current task's last execution runs, so its container is booted (and its tree
    /// staged) ahead too (`--no-next-task-ahead`: off).
    #[serde(default = "next_task_ahead_default")]
    pub next_task_ahead: bool,
    /// What a sweep may make this node run besides the evaluation itself.
    #[serde(default)]
    pub code: CodePolicy,
}

/// What a node lets a sweep run besides the evaluation itself (`reprobench node --allow-*`).
/// A sweep comes from whoever holds a client credential; these are the node owner's answer.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CodePolicy {
    /// Run sweep-supplied agents (`[[agents]] command` or `image`), which run with the node's
    /// network and environment.
    pub agent_commands: bool,
    /// Run an environment's own `pre_install`/`install`/`eval_commands` when they are not
    /// reprobench's (SWT-bench's specs and the built-in datasets' env maps, as this binary
    /// ships them).
    pub env_commands: bool,
    /// Variables a backbone's `api_key_env` may name; `None`: any (local nodes of `run`,
    /// `eval` and `quickstart`, whose sweeps come from their own user).
    pub key_envs: Option<Vec<String>>,
    /// Hosts a backbone's `http://` base URL may name besides loopback.
    pub http_hosts: Vec<String>,
    /// Command fingerprints of the environments this binary ships (`EnvSpec::commands_fingerprint`),
    /// filled when the node starts.
    #[serde(skip)]
    pub shipped_envs: Arc<std::collections::BTreeSet<String>>,
}

impl Default for CodePolicy {
    /// Nothing beyond the evaluation: no sweep-supplied agent or environment command, no key.
    fn default() -> Self {
        CodePolicy {
            agent_commands: false,
            env_commands: false,
            key_envs: Some(Vec::new()),
            http_hosts: Vec::new(),
            shipped_envs: Arc::default(),
        }
    }
}

impl CodePolicy {
    /// The policy of a node whose sweeps come from its own user: everything allowed.
    pub fn own_user() -> CodePolicy {
        CodePolicy {
            agent_commands: true,
            env_commands: true,
            key_envs: None,
            ..CodePolicy::default()
        }
    }
}

impl Default for SwtSettings {
    fn default() -> Self {
        let docker = DockerConfig::default();
        SwtSettings {
            repos: reprobench_domain::swt::default_datasets_dir().join("repos"),
            cache_dir: docker.cache_dir.clone(),
            artifacts: docker.cache_dir.join("artifacts"),
            docker,
            replay: None,
            android_sim: reprobench_domain::swt::default_datasets_dir().join("android-sim"),
            sim_latency_scale: 0.0,
            preassess_replicas: reprobench_android::executor::DEFAULT_PREASSESS_REPLICAS,
            emulator: None,
            allow_unisolated_process: false,
            stage_ahead: Default::default(),
            next_task_ahead: next_task_ahead_default(),
            code: CodePolicy::default(),
        }
    }
}

fn next_task_ahead_default() -> bool {
    true
}

/// Cache directory of the process sandbox: `CACHE/process`, unless the node runs as root and the
/// unprivileged user executions run as cannot reach it (a cache under /root); then /var/tmp.
fn process_cache_dir(cache: &std::path::Path) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let _ = std::fs::create_dir_all(cache);
    if root && !reprobench_sandbox::process::nobody_can_reach(cache) {
        PathBuf::from("/var/tmp/reprobench/process")
    } else {
        cache.join("process")
    }
}

/// Builds the executor of each kind the node offers slots for.
async fn build_executors(
    cfg: &NodeConfig,
) -> Result<HashMap<ExecutorKind, Arc<dyn Executor>>, NodeError> {
    let mut executors: HashMap<ExecutorKind, Arc<dyn Executor>> = HashMap::new();
    let mut gateway: Option<Gateway> = None;
    for spec in &cfg.slots {
        let kind = spec.kind;
        if kind.runs_agents() && gateway.is_none() {
            let code = &cfg.swt.code;
            let config = GatewayConfig {
                replay: cfg.swt.replay.clone(),
                upstream_policy: code.key_envs.as_ref().map(|key_envs| UpstreamPolicy {
                    holder: format!("node `{}`", cfg.node_id),
                    key_envs: key_envs.clone(),
                    http_hosts: code.http_hosts.clone(),
                }),
                ..GatewayConfig::default()
            };
            let g = Gateway::start(([127, 0, 0, 1], 0).into(), config)
                .await
                .map_err(|e| NodeError::Config(format!("the node's LLM gateway: {e}")))?;
            tracing::info!(url = %g.base_url(), replay = g.is_replay(), "LLM gateway listening");
            gateway = Some(g);
        }
        let s = &cfg.swt;
        let exec: Arc<dyn Executor> = match kind {
            ExecutorKind::Synthetic => Arc::new(SyntheticExecutor),
            ExecutorKind::Sim => {
                let e = reprobench_android::executor::SimExecutor::new(
                    s.android_sim.clone(),
                    s.sim_latency_scale,
                    s.artifacts.clone(),
                )
                .with_replicas(s.preassess_replicas);
                Arc::new(match &gateway {
                    Some(g) => e.with_gateway(g.clone()),
                    None => e,
                })
            }
            ExecutorKind::Emulator => {
                let Some(mut settings) = s.emulator.clone() else {
                    return Err(NodeError::Config(
                        "--slots emulator=N needs an emulator setup: pass --avd NAME (and --apks DIR; optionally --emulator PATH, --adb PATH, --emulators N, --android-datasets DIR)".into(),
                    ));
                };
                if settings.emulators == 0 {
                    // One emulator per slot unless --emulators says otherwise.
                    settings.emulators = spec.slots.min(u16::MAX as u32) as u16;
                }
                let e = reprobench_android::emulator::EmulatorExecutor::new(settings)
                    .map_err(|e| NodeError::Config(format!("--slots emulator=N: {e}")))?;
                Arc::new(match &gateway {
                    Some(g) => e.with_gateway(g.clone()),
                    None => e,
                })
            }
            ExecutorKind::Process => {
                let sandbox = Arc::new(
                    ProcessSandbox::new(process_cache_dir(&s.cache_dir))
                        .allow_unisolated(s.allow_unisolated_process)
                        .stage_ahead(s.stage_ahead),
                );
                let e = SwtExecutor::new(
                    sandbox,
                    s.repos.clone(),
                    s.cache_dir.clone(),
                    s.artifacts.clone(),
                )
                .with_code_policy(&cfg.node_id, s.code.clone())
                .with_next_task_ahead(s.next_task_ahead);
                Arc::new(match &gateway {
                    Some(g) => e.with_gateway(g.clone()),
                    None => e,
                })
            }
            ExecutorKind::Docker => {
                let sandbox = DockerSandbox::connect(s.docker.clone(), s.stage_ahead)
                    .await
                    .map_err(|e| NodeError::Config(format!("--slots docker=N: {e}")))?;
                let e = SwtExecutor::new(
                    Arc::new(sandbox),
                    s.repos.clone(),
                    s.cache_dir.clone(),
                    s.artifacts.clone(),
                )
                .with_code_policy(&cfg.node_id, s.code.clone())
                .with_next_task_ahead(s.next_task_ahead);
                Arc::new(match &gateway {
                    Some(g) => e.with_gateway(g.clone()),
                    None => e,
                })
            }
        };
        executors.insert(kind, exec);
    }
    Ok(executors)
}

/// Why a node stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The coordinator refused this node (token, protocol version, bad slots).
    #[error("the coordinator refused this node: {0}")]
    Refused(String),
    /// The configuration cannot work.
    #[error("{0}")]
    Config(String),
}

/// Events from attempts and from the connection's reader task.
enum Event {
    Done {
        attempt: AttemptRef,
        end: AttemptEnd,
    },
    Inbound {
        generation: u64,
        body: coordinator_message::Body,
    },
    Closed {
        generation: u64,
        reason: String,
    },
}

/// A granted attempt the node still holds: running, stopping, or finished and awaiting its ack.
struct HeldAttempt {
    attempt: AttemptRef,
    /// Where it is in its lifecycle ([`crate::attempt`]); final states are never stored.
    state: AttemptState,
    kind: ExecutorKind,
    cancel: CancellationToken,
    /// The node's own view of the lease: it stops the attempt when this passes without renewal.
    local_deadline: Instant,
    /// Its result once it finished, kept (and resent on reconnection) until acknowledged.
    result: Option<AttemptResult>,
}

struct Connection {
    generation: u64,
    out: mpsc::UnboundedSender<NodeMessage>,
    /// Send times of heartbeats (and the hello) not yet answered by a renewal.
    unanswered: VecDeque<Instant>,
}

struct Node {
    cfg: NodeConfig,
    executors: HashMap<ExecutorKind, Arc<dyn Executor>>,
    free: HashMap<ExecutorKind, u32>,
    /// Every attempt the node holds, by (task id, epoch).
    attempts: BTreeMap<(u64, u64), HeldAttempt>,
    warm: HashSet<String>,
    conn: Option<Connection>,
    generation: u64,
    lease_ms: u64,
    heartbeat_ms: u64,
    draining: bool,
    /// The coordinator acknowledged this connection's `Draining`: no grant is on its way.
    drain_acked: bool,
    drain_deadline: Option<Instant>,
    events_tx: mpsc::UnboundedSender<Event>,
    /// Executors' progress reports, by the executors' (domain) attempt reference.
    progress_tx: mpsc::UnboundedSender<(reprobench_executor::AttemptRef, f64, String)>,
    /// Random per process, sent at registration (see `RegisterRequest.session`).
    session: String,
}

fn msg(body: node_message::Body) -> NodeMessage {
    NodeMessage { body: Some(body) }
}

/// Runs a node until it is drained (after `shutdown` resolves, or the coordinator asks) or refused.
/// A second resolution of `shutdown` (e.g. a second Ctrl-C) hands running work back at once.
pub async fn run_node(
    cfg: NodeConfig,
    mut shutdown: mpsc::UnboundedReceiver<()>,
) -> Result<(), NodeError> {
    let executors = build_executors(&cfg).await?;
    if cfg.slots.is_empty() {
        return Err(NodeError::Config(
            "no slots offered; pass --slots KIND=N, e.g. --slots synthetic=2".into(),
        ));
    }
    let (events_tx, mut events_rx) = mpsc::unbounded_channel();
    let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
    let mut node = Node {
        free: cfg.slots.iter().map(|s| (s.kind, s.slots)).collect(),
        cfg,
        executors,
        attempts: BTreeMap::new(),
        warm: HashSet::new(),
        conn: None,
        generation: 0,
        lease_ms: 15_000,
        heartbeat_ms: 3_000,
        draining: false,
        drain_acked: false,
        drain_deadline: None,
        events_tx,
        progress_tx,
        session: reprobench_domain::secret::random_hex(16),
    };

    let mut backoff = Duration::from_millis(100);
    let mut next_connect = Instant::now();
    let mut next_heartbeat = Instant::now();
    let mut signals = 0u32;
    let mut shutdown_open = true;
    let watchdog = Duration::from_millis(50);
    loop {
        if node.drained() {
            if node.unacked() != 0 {
                tracing::warn!(
                    results = node.unacked(),
                    "drained without delivering every result; the coordinator will rerun those tasks when their leases expire"
                );
            }
            tracing::info!(node = %node.cfg.node_id, "drained; stopping");
            // What executions left for later (containers being removed), within a bound: a
            // node that cannot finish it leaves it to the next one to start here.
            let executors: Vec<_> = node.executors.values().cloned().collect();
            let settled = async move {
                for e in executors {
                    e.settle().await;
                }
            };
            if tokio::time::timeout(Duration::from_secs(60), settled)
                .await
                .is_err()
            {
                tracing::warn!(
                    "stopping before the executors finished cleaning up; the next node to start here removes what is left"
                );
            }
            return Ok(());
        }
        if node.conn.is_none() && Instant::now() >= next_connect {
            match node.connect().await {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    next_heartbeat = Instant::now() + Duration::from_millis(node.heartbeat_ms);
                }
                Err(ConnectFailure::Fatal(e)) => return Err(e),
                Err(ConnectFailure::Retry(reason)) => {
                    let jitter = 0.5
                        + reprobench_domain::synthetic::SplitMix64::new(
                            node.generation ^ u64::from(std::process::id()),
                        )
                        .next_f64();
                    let wait = backoff.mul_f64(jitter).min(node.cfg.max_backoff);
                    tracing::warn!(%reason, retry_in_ms = wait.as_millis() as u64, "coordinator unreachable; retrying");
                    next_connect = Instant::now() + wait;
                    backoff = (backoff * 2).min(node.cfg.max_backoff);
                }
            }
            continue;
        }
        let wake = [
            Some(Instant::now() + watchdog),
            node.conn.is_none().then_some(next_connect),
            node.conn.is_some().then_some(next_heartbeat),
            node.drain_deadline,
        ]
        .into_iter()
        .flatten()
        .min()
        .expect("the watchdog is always set");
        tokio::select! {
            Some(ev) = events_rx.recv() => node.handle(ev),
            Some((attempt, fraction, message)) = progress_rx.recv() => {
                node.send(node_message::Body::Progress(AttemptProgress { attempt: Some(attempt.into()), message, fraction }));
            }
            sig = shutdown.recv(), if shutdown_open => {
                signals += 1;
                shutdown_open = sig.is_some();
                if signals > 1 {
                    tracing::warn!("second stop request: handing running work back now");
                    node.drain_deadline = Some(Instant::now());
                }
                node.start_drain("stop requested");
            }
            _ = tokio::time::sleep_until(wake.into()) => {}
        }
        let now = Instant::now();
        if node.conn.is_some() && now >= next_heartbeat {
            node.heartbeat();
            next_heartbeat = now + Duration::from_millis(node.heartbeat_ms);
        }
        if node.drain_deadline.is_some_and(|d| now >= d) {
            node.hand_back_all();
        }
        node.check_local_leases(now);
    }
}

enum ConnectFailure {
    Fatal(NodeError),
    Retry(String),
}

impl Node {
    /// The node's own lease length: a tenth shorter than the coordinator's, so the node gives
    /// work up before the coordinator can grant it to someone else.
    fn local_lease(&self, lease_ms: u64) -> Duration {
        let ms = if lease_ms == 0 {
            self.lease_ms
        } else {
            lease_ms
        };
        Duration::from_millis(ms - ms / 10)
    }

    /// Whether a draining node may stop: nothing runs, and every result was delivered with no
    /// grant on its way (the coordinator acknowledged the drain), or, with no connection, every
    /// result was delivered or 10 s have passed since the drain's deadline.
    fn drained(&self) -> bool {
        if !self.draining || self.running() != 0 {
            return false;
        }
        match self.conn {
            Some(_) => self.unacked() == 0 && self.drain_acked,
            None => self.unacked() == 0 || self.past_drain(Duration::from_secs(10)),
        }
    }

    fn past_drain(&self, grace: Duration) -> bool {
        self.drain_deadline
            .is_some_and(|d| Instant::now() >= d + grace)
    }

    fn send(&self, body: node_message::Body) {
        if let Some(c) = &self.conn {
            let _ = c.out.send(msg(body));
        }
    }

    /// Attempts whose lease the node still holds, including finished ones awaiting an ack.
    fn held(&self) -> Vec<AttemptRef> {
        self.attempts.values().map(|a| a.attempt).collect()
    }

    /// How many attempts still hold a slot (their executions have not returned).
    fn running(&self) -> usize {
        self.attempts
            .values()
            .filter(|a| a.state.holds_slot())
            .count()
    }

    /// How many finished attempts wait for the coordinator's ack.
    fn unacked(&self) -> usize {
        self.attempts
            .values()
            .filter(|a| a.state == AttemptState::Unacked)
            .count()
    }

    /// Moves a held attempt through the lifecycle table and does what the step says. Returns
    /// whether the event applied (an event its state does not take changes nothing).
    fn step(&mut self, key: (u64, u64), event: AttemptEvent) -> bool {
        let Some(held) = self.attempts.get_mut(&key) else {
            return false;
        };
        let step = match attempt::next(held.state, event) {
            Ok(step) => step,
            Err(e) => {
                tracing::debug!(task = key.0, epoch = key.1, "ignored: {e}");
                return false;
            }
        };
        held.state = step.to;
        let (attempt, kind, cancel) = (held.attempt, held.kind, held.cancel.clone());
        let result = held.result.clone();
        for action in step.actions {
            match action {
                Action::Cancel => cancel.cancel(),
                Action::SendResult => {
                    if let Some(result) = result.clone() {
                        self.send(node_message::Body::Result(result));
                    }
                }
                Action::SendHandBack => self.send(hand_back(attempt, "node draining".into())),
                Action::FreeSlot => {
                    *self.free.entry(kind).or_insert(0) += 1;
                    if !self.draining {
                        self.send(node_message::Body::Credit(Credit {
                            kind: kind.to_string(),
                            slots: 1,
                        }));
                    }
                }
            }
        }
        if step.to.is_final() {
            self.attempts.remove(&key);
        }
        true
    }

    async fn connect(&mut self) -> Result<(), ConnectFailure> {
        let channel = self.cfg.coordinator.connect().await.map_err(|e| match e {
            ClientError::Unreachable { .. } => ConnectFailure::Retry(e.to_string()),
            other => ConnectFailure::Fatal(NodeError::Config(other.to_string())),
        })?;
        let mut client = NodeServiceClient::new(channel).max_decoding_message_size(usize::MAX);
        let slots = self
            .cfg
            .slots
            .iter()
            .map(|s| SlotCount {
                kind: s.kind.to_string(),
                slots: s.slots,
            })
            .collect();
        let req = RegisterRequest {
            protocol_version: reprobench_proto::PROTOCOL_VERSION,
            node_id: self.cfg.node_id.clone(),
            hostname: hostname(),
            slots,
            binary_version: reprobench_proto::BINARY_VERSION.into(),
            session: self.session.clone(),
        };
        let classify = |s: tonic::Status| match s.code() {
            Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::InvalidArgument
            | Code::PermissionDenied => {
                ConnectFailure::Fatal(NodeError::Refused(s.message().to_string()))
            }
            _ => ConnectFailure::Retry(format!("{}: {}", s.code(), s.message())),
        };
        let resp = client.register(req).await.map_err(classify)?.into_inner();
        self.lease_ms = resp.lease_ms.max(100);
        self.heartbeat_ms = resp.heartbeat_ms.clamp(20, self.lease_ms / 2);

        let (out, rx) = mpsc::unbounded_channel();
        let free = self
            .free
            .iter()
            .map(|(k, n)| SlotCount {
                kind: k.to_string(),
                slots: if self.draining { 0 } else { *n },
            })
            .collect();
        let hello = Hello {
            node_id: self.cfg.node_id.clone(),
            running: self.held(),
            free,
            warm_keys: self.warm.iter().cloned().collect(),
            draining: self.draining,
            session: self.session.clone(),
        };
        let _ = out.send(msg(node_message::Body::Hello(hello)));
        let sent_at = Instant::now();
        let mut inbound = client
            .work(UnboundedReceiverStream::new(rx))
            .await
            .map_err(classify)?
            .into_inner();
        self.generation += 1;
        let generation = self.generation;
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let reason = loop {
                match inbound.message().await {
                    Ok(Some(m)) => {
                        if let Some(body) = m.body
                            && events.send(Event::Inbound { generation, body }).is_err()
                        {
                            return;
                        }
                    }
                    Ok(None) => break "the coordinator closed the stream".to_string(),
                    Err(s) => break format!("{}: {}", s.code(), error_chain(&s)),
                }
            };
            let _ = events.send(Event::Closed { generation, reason });
        });
        self.conn = Some(Connection {
            generation,
            out,
            unanswered: VecDeque::from([sent_at]),
        });
        let unacked: Vec<AttemptResult> = self
            .attempts
            .values()
            .filter_map(|a| a.result.clone())
            .collect();
        for r in unacked {
            self.send(node_message::Body::Result(r));
        }
        if self.draining {
            self.drain_acked = false;
            self.send(node_message::Body::Draining(Draining {}));
        }
        tracing::info!(node = %self.cfg.node_id, url = %self.cfg.coordinator.url, held = self.attempts.len(), "connected to the coordinator");
        Ok(())
    }

    fn heartbeat(&mut self) {
        let running = self.held();
        if let Some(c) = &mut self.conn {
            c.unanswered.push_back(Instant::now());
            let _ = c
                .out
                .send(msg(node_message::Body::Heartbeat(Heartbeat { running })));
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Done { attempt, end } => self.attempt_done(attempt, end),
            Event::Closed { generation, reason } => {
                if self
                    .conn
                    .as_ref()
                    .is_some_and(|c| c.generation == generation)
                {
                    tracing::warn!(%reason, "lost the coordinator; running attempts go on while their leases last");
                    self.conn = None;
                }
            }
            Event::Inbound { generation, body } => {
                if self
                    .conn
                    .as_ref()
                    .is_some_and(|c| c.generation == generation)
                {
                    self.inbound(body);
                }
            }
        }
    }

    fn inbound(&mut self, body: coordinator_message::Body) {
        use coordinator_message::Body;
        match body {
            Body::Grant(g) => {
                let Some(attempt) = g.attempt else { return };
                // The wire names the kind; from here on it is an `ExecutorKind`.
                let kind = ExecutorKind::parse(&g.kind);
                let free = kind.and_then(|k| self.free.get_mut(&k));
                let (Some(kind), Some(free), Some(exec)) = (
                    kind,
                    free.filter(|f| **f > 0),
                    kind.and_then(|k| self.executors.get(&k).cloned()),
                ) else {
                    let reason = format!("no free `{}` slot on {}", g.kind, self.cfg.node_id);
                    self.send(hand_back(attempt, reason));
                    return;
                };
                *free -= 1;
                let cancel = CancellationToken::new();
                let local_deadline = Instant::now() + self.local_lease(g.lease_ms);
                let key = (attempt.task_id, attempt.epoch);
                self.attempts.insert(
                    key,
                    HeldAttempt {
                        attempt,
                        state: AttemptState::Granted,
                        kind,
                        cancel: cancel.clone(),
                        local_deadline,
                        result: None,
                    },
                );
                self.step(key, AttemptEvent::Started);
                self.warm.insert(g.affinity_key.clone());
                tracing::debug!(task = attempt.task_id, epoch = attempt.epoch, instance = %g.instance_id, "granted");
                let spec = AttemptSpec {
                    attempt: attempt.into(),
                    run_id: g.run_id,
                    agent: g.agent,
                    variant: g.variant,
                    instance_id: g.instance_id,
                    affinity_key: g.affinity_key,
                    payload_json: g.payload_json,
                    attempt_number: g.attempt_number,
                };
                let ctx = AttemptContext {
                    cancel,
                    progress: self.progress_tx.clone(),
                };
                exec.upcoming(g.upcoming.map(|next| next.payload_json));
                let events = self.events_tx.clone();
                let span = attempt_span(&spec);
                tokio::spawn(
                    async move {
                        let end = run_catching_panics(exec, spec, ctx).await;
                        let _ = events.send(Event::Done { attempt, end });
                    }
                    .instrument(span),
                );
            }
            Body::Renewal(r) => {
                let sent_at = self
                    .conn
                    .as_mut()
                    .and_then(|c| c.unanswered.pop_front())
                    .unwrap_or_else(Instant::now);
                let deadline = sent_at + self.local_lease(r.lease_ms);
                for a in r.renewed {
                    if let Some(held) = self.attempts.get_mut(&(a.task_id, a.epoch))
                        && held.state.holds_slot()
                    {
                        held.local_deadline = held.local_deadline.max(deadline);
                    }
                }
            }
            Body::Revoke(r) | Body::Cancel(r) => {
                if let Some(a) = r.attempt
                    && self.state_of(a) == Some(AttemptState::Running)
                {
                    tracing::warn!(task = a.task_id, epoch = a.epoch, reason = %r.reason, "attempt stopped by the coordinator");
                    self.step((a.task_id, a.epoch), AttemptEvent::Revoked);
                }
            }
            Body::ResultAck(ack) => {
                if let Some(a) = ack.attempt {
                    self.step((a.task_id, a.epoch), AttemptEvent::Acked);
                    if !ack.accepted {
                        tracing::warn!(task = a.task_id, epoch = a.epoch, reason = %ack.reason, "result refused");
                    }
                }
            }
            Body::Drain(d) => self.start_drain(&d.reason),
            Body::DrainingAck(_) => self.drain_acked = self.draining,
        }
    }

    /// Where a held attempt is, if the node holds it.
    fn state_of(&self, a: AttemptRef) -> Option<AttemptState> {
        self.attempts.get(&(a.task_id, a.epoch)).map(|h| h.state)
    }

    fn attempt_done(&mut self, attempt: AttemptRef, end: AttemptEnd) {
        let key = (attempt.task_id, attempt.epoch);
        match end {
            AttemptEnd::Finished(outcome) => {
                if let Some(held) = self.attempts.get_mut(&key) {
                    // The edge: the executor's outcome becomes the wire's here.
                    held.result = Some(AttemptResult {
                        attempt: Some(attempt),
                        outcome: Some(outcome.into()),
                    });
                }
                self.step(key, AttemptEvent::Finished);
            }
            AttemptEnd::Cancelled => {
                self.step(key, AttemptEvent::Cancelled);
            }
        }
    }

    /// Stops attempts whose lease ran out without renewal: the coordinator may have given them to another node.
    fn check_local_leases(&mut self, now: Instant) {
        let expired: Vec<(u64, u64)> = self
            .attempts
            .iter()
            .filter(|(_, h)| h.state == AttemptState::Running && now >= h.local_deadline)
            .map(|(key, _)| *key)
            .collect();
        for key in expired {
            tracing::warn!(
                task = key.0,
                epoch = key.1,
                "lease ran out without renewal; stopping the attempt"
            );
            self.step(key, AttemptEvent::LeaseExpired);
        }
    }

    fn start_drain(&mut self, reason: &str) {
        if self.draining {
            return;
        }
        tracing::info!(%reason, running = self.running(), "draining: finishing running attempts, taking no new ones");
        self.draining = true;
        self.drain_deadline
            .get_or_insert(Instant::now() + self.cfg.drain_timeout);
        self.send(node_message::Body::Draining(Draining {}));
    }

    fn hand_back_all(&mut self) {
        let held: Vec<(u64, u64)> = self
            .attempts
            .iter()
            .filter(|(_, h)| h.state.holds_slot())
            .map(|(key, _)| *key)
            .collect();
        for key in held {
            self.step(key, AttemptEvent::HandBack);
        }
    }
}

fn hand_back(attempt: AttemptRef, reason: String) -> node_message::Body {
    node_message::Body::HandBack(HandBack {
        attempt: Some(attempt),
        reason,
    })
}

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer we own.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown-host".into()
    }
}

/// The spans an attempt's log lines carry: `run{id}` ⊃ `task{id, instance, agent, variant}` ⊃
/// `attempt{epoch, n}`, so that one task can be followed through a node's log.
pub fn attempt_span(spec: &AttemptSpec) -> tracing::Span {
    let run = tracing::info_span!(parent: None, "run", id = %spec.run_id);
    let task = tracing::info_span!(
        parent: &run,
        "task",
        id = spec.attempt.task_id,
        instance = %spec.instance_id,
        agent = %spec.agent,
        variant = %spec.variant
    );
    tracing::info_span!(
        parent: &task,
        "attempt",
        epoch = spec.attempt.epoch,
        n = spec.attempt_number
    )
}

/// Runs one attempt in a task of its own, so that a panic in the executor ends the attempt as an
/// infrastructure failure (retried under the run's `max_attempts`) and frees its slot, instead
/// of leaving it listed, renewed and holding the slot forever.
async fn run_catching_panics(
    exec: Arc<dyn Executor>,
    spec: AttemptSpec,
    ctx: AttemptContext,
) -> AttemptEnd {
    let kind = exec.kind();
    let attempt = spec.attempt;
    if let Err(message) = names_are_path_components(&spec) {
        return reprobench_executor::error_end(FailureClass::BadInput, "unsafe_name", message);
    }
    match tokio::spawn(async move { exec.run(spec, ctx).await }.in_current_span()).await {
        Ok(end) => end,
        Err(e) => {
            let what = match e.try_into_panic() {
                Ok(payload) => panic_text(payload.as_ref()),
                Err(e) => e.to_string(),
            };
            tracing::error!(task = attempt.task_id, epoch = attempt.epoch, %kind, panic = %what, "the executor panicked; the attempt ends as an infrastructure failure");
            reprobench_executor::error_end(
                FailureClass::Infra,
                "executor_panic",
                format!("the `{kind}` executor panicked while running this attempt: {what}"),
            )
        }
    }
}

/// Executors join the run id, instance id, agent and variant into artifact paths: a grant whose
/// names could leave those directories (a coordinator that did not check them) is refused here.
/// (An empty name joins as nothing, so only names that are there are checked.)
fn names_are_path_components(spec: &AttemptSpec) -> Result<(), String> {
    [
        ("run id", &spec.run_id),
        ("instance_id", &spec.instance_id),
        ("agent name", &spec.agent),
        ("variant", &spec.variant),
    ]
    .into_iter()
    .filter(|(_, name)| !name.is_empty())
    .try_for_each(|(what, name)| reprobench_domain::ids::checked(what, name))
}

/// The message a panic carried (`panic!("…")` gives a `&str` or a `String`).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with no message".into()
    }
}

/// A stop-request channel fed by SIGTERM and SIGINT: the first drains, the second hands work back.
pub fn stop_signals() -> mpsc::UnboundedReceiver<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    rx
}

#[cfg(test)]
mod emulator_slot_tests {
    use super::*;

    fn cfg(swt: SwtSettings) -> NodeConfig {
        NodeConfig {
            coordinator: reprobench_proto::auth::CoordinatorAddress {
                url: "http://127.0.0.1:1".into(),
                token: "t".into(),
                tls_ca: None,
                tls_server_name: None,
            },
            node_id: "n".into(),
            slots: vec![SlotSpec {
                kind: ExecutorKind::Emulator,
                slots: 2,
            }],
            drain_timeout: Duration::from_secs(1),
            max_backoff: Duration::from_secs(1),
            swt,
        }
    }

    #[tokio::test]
    async fn emulator_slots_need_an_avd() {
        let err = build_executors(&cfg(SwtSettings::default()))
            .await
            .err()
            .expect("no AVD");
        let msg = err.to_string();
        assert!(msg.contains("--avd") && msg.contains("--apks"), "{msg}");
        let mut swt = SwtSettings::default();
        let dir = tempfile::tempdir().unwrap();
        let mut e = reprobench_android::emulator::EmulatorSettings::new(
            "pixel_34",
            dir.path().into(),
            dir.path().into(),
            dir.path().into(),
        );
        e.emulators = 0;
        swt.emulator = Some(e);
        let execs = build_executors(&cfg(swt)).await.unwrap();
        assert_eq!(
            execs[&ExecutorKind::Emulator].kind(),
            ExecutorKind::Emulator
        );
    }
}

#[cfg(test)]
mod panic_tests {
    use super::*;
    use reprobench_executor::BoxFuture;
    use reprobench_executor::Outcome;
    use reprobench_proto::v1::Grant;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Fault injection: panics on its first `panics` attempts (holding a shared lock while it
    /// does, as the docker sandbox and the emulator pool hold theirs), then succeeds.
    struct PanickingExecutor {
        panics: u32,
        calls: AtomicU32,
        shared: Arc<Mutex<Vec<u64>>>,
    }

    impl Executor for PanickingExecutor {
        fn kind(&self) -> ExecutorKind {
            ExecutorKind::Synthetic
        }
        fn run(&self, spec: AttemptSpec, _ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
            let call = self.calls.fetch_add(1, Ordering::SeqCst);
            let panics = call < self.panics;
            let shared = self.shared.clone();
            Box::pin(async move {
                let mut held = shared.lock().unwrap_or_else(|e| e.into_inner());
                held.push(spec.attempt.task_id);
                if panics {
                    panic!("injected fault in task {}", spec.attempt.task_id);
                }
                AttemptEnd::Finished(Outcome {
                    success: true,
                    verdict: "ok".into(),
                    ..Default::default()
                })
            })
        }
    }

    fn node(
        exec: Arc<dyn Executor>,
    ) -> (
        Node,
        mpsc::UnboundedReceiver<Event>,
        mpsc::UnboundedReceiver<NodeMessage>,
    ) {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (progress_tx, _progress_rx) = mpsc::unbounded_channel();
        let (out, out_rx) = mpsc::unbounded_channel();
        let node = Node {
            cfg: NodeConfig {
                coordinator: CoordinatorAddress {
                    url: "http://127.0.0.1:1".into(),
                    token: "t".into(),
                    tls_ca: None,
                    tls_server_name: None,
                },
                node_id: "n".into(),
                slots: vec![SlotSpec {
                    kind: ExecutorKind::Synthetic,
                    slots: 1,
                }],
                drain_timeout: Duration::from_secs(1),
                max_backoff: Duration::from_secs(1),
                swt: SwtSettings::default(),
            },
            executors: HashMap::from([(ExecutorKind::Synthetic, exec)]),
            free: HashMap::from([(ExecutorKind::Synthetic, 1)]),
            attempts: BTreeMap::new(),
            warm: HashSet::new(),
            conn: Some(Connection {
                generation: 1,
                out,
                unanswered: VecDeque::new(),
            }),
            generation: 1,
            lease_ms: 15_000,
            heartbeat_ms: 3_000,
            draining: false,
            drain_acked: false,
            drain_deadline: None,
            events_tx,
            progress_tx,
            session: "s".into(),
        };
        (node, events_rx, out_rx)
    }

    fn grant(task_id: u64) -> Event {
        Event::Inbound {
            generation: 1,
            body: coordinator_message::Body::Grant(Grant {
                attempt: Some(AttemptRef { task_id, epoch: 1 }),
                run_id: "r".into(),
                kind: "synthetic".into(),
                instance_id: format!("i{task_id}"),
                lease_ms: 60_000,
                attempt_number: 1,
                ..Default::default()
            }),
        }
    }

    /// Runs one granted attempt to its end and hands the node its `Done` event.
    async fn run_one(
        node: &mut Node,
        events: &mut mpsc::UnboundedReceiver<Event>,
        task_id: u64,
    ) -> AttemptResult {
        run_granted(node, events, grant(task_id), task_id).await
    }

    /// Hands the node `granted` (a grant of `task_id`) and runs it to its end.
    async fn run_granted(
        node: &mut Node,
        events: &mut mpsc::UnboundedReceiver<Event>,
        granted: Event,
        task_id: u64,
    ) -> AttemptResult {
        node.handle(granted);
        assert_eq!(
            node.free[&ExecutorKind::Synthetic],
            0,
            "the grant takes the slot"
        );
        let done = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("the attempt ends within 30 s")
            .expect("events open");
        node.handle(done);
        let held = &node.attempts[&(task_id, 1)];
        assert_eq!(held.state, AttemptState::Unacked);
        held.result
            .clone()
            .expect("a finished attempt keeps its result")
    }

    /// Each log event: the spans it is in, root first, as (name, fields).
    type Scopes = Arc<Mutex<Vec<Vec<(String, Vec<String>)>>>>;

    #[derive(Default)]
    struct Fields(Vec<String>);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
            self.0.push(format!("{}={v:?}", f.name()));
        }
    }

    /// A tracing layer that keeps every event's span scope.
    struct CaptureScopes(Scopes);

    impl<S> tracing_subscriber::Layer<S> for CaptureScopes
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            id: &tracing::span::Id,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let mut fields = Fields::default();
            attrs.record(&mut fields);
            ctx.span(id).unwrap().extensions_mut().insert(fields);
        }

        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            ctx: tracing_subscriber::layer::Context<'_, S>,
        ) {
            let scope = ctx.event_scope(event).map_or_else(Vec::new, |scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let fields = span
                            .extensions()
                            .get::<Fields>()
                            .map(|f| f.0.clone())
                            .unwrap_or_default();
                        (span.name().to_string(), fields)
                    })
                    .collect()
            });
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(scope);
        }
    }

    /// Logs one line from inside its attempt.
    struct LoggingExecutor;

    impl Executor for LoggingExecutor {
        fn kind(&self) -> ExecutorKind {
            ExecutorKind::Synthetic
        }
        fn run(&self, _spec: AttemptSpec, _ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
            Box::pin(async move {
                tracing::info!("inside the executor");
                AttemptEnd::Finished(Outcome::default())
            })
        }
    }

    #[tokio::test]
    async fn an_executor_s_log_lines_carry_its_run_task_and_attempt() {
        use tracing_subscriber::layer::SubscriberExt;
        let scopes: Scopes = Arc::default();
        let subscriber = tracing_subscriber::registry().with(CaptureScopes(scopes.clone()));
        let _guard = tracing::subscriber::set_default(subscriber);
        let (mut node, mut events, _out) = node(Arc::new(LoggingExecutor));
        run_one(&mut node, &mut events, 42).await;
        let scopes = scopes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let inside: Vec<_> = scopes.iter().filter(|s| s.len() == 3).collect();
        assert_eq!(inside.len(), 1, "one event inside an attempt: {scopes:?}");
        let names: Vec<&str> = inside[0].iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["run", "task", "attempt"]);
        assert!(inside[0][0].1.contains(&"id=r".to_string()), "{inside:?}");
        assert!(inside[0][1].1.contains(&"id=42".to_string()), "{inside:?}");
        assert!(
            inside[0][1].1.contains(&"instance=i42".to_string()),
            "{inside:?}"
        );
        assert!(
            inside[0][2].1.contains(&"epoch=1".to_string()),
            "{inside:?}"
        );
    }

    /// A grant whose instance id would leave the artifact tree (a coordinator that did not
    /// check it) ends as bad input before the executor sees it.
    #[tokio::test]
    async fn a_grant_with_a_name_that_escapes_never_reaches_the_executor() {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let exec = Arc::new(PanickingExecutor {
            panics: 1,
            calls: AtomicU32::new(0),
            shared: calls,
        });
        let (mut node, mut events, _out) = node(exec.clone());
        let Event::Inbound {
            body: coordinator_message::Body::Grant(mut g),
            ..
        } = grant(3)
        else {
            unreachable!("a grant")
        };
        g.instance_id = "../../etc".into();
        let granted = Event::Inbound {
            generation: 1,
            body: coordinator_message::Body::Grant(g),
        };
        let result = run_granted(&mut node, &mut events, granted, 3).await;
        let o = result.outcome.expect("an outcome");
        assert_eq!(
            reprobench_proto::convert::failure_class(o.failure_class),
            FailureClass::BadInput,
            "{o:?}"
        );
        assert_eq!(o.error_class, "unsafe_name");
        assert_eq!(
            exec.calls.load(Ordering::SeqCst),
            0,
            "the executor never ran"
        );
    }

    #[tokio::test]
    async fn a_panicking_attempt_ends_as_an_infra_failure_and_frees_its_slot() {
        let shared = Arc::new(Mutex::new(Vec::new()));
        let exec = Arc::new(PanickingExecutor {
            panics: 1,
            calls: AtomicU32::new(0),
            shared: shared.clone(),
        });
        let (mut node, mut events, mut out) = node(exec);

        let first = run_one(&mut node, &mut events, 7).await;
        let o = first.outcome.expect("an outcome");
        assert_eq!(
            reprobench_proto::convert::failure_class(o.failure_class),
            FailureClass::Infra,
            "{o:?}"
        );
        assert_eq!(o.error_class, "executor_panic");
        assert!(
            o.error_message.contains("injected fault in task 7"),
            "{o:?}"
        );
        assert_eq!(node.running(), 0, "no longer listed as running");
        assert_eq!(
            node.free[&ExecutorKind::Synthetic],
            1,
            "its slot is free again"
        );
        let sent: Vec<NodeMessage> = std::iter::from_fn(|| out.try_recv().ok()).collect();
        assert!(
            sent.iter()
                .any(|m| matches!(&m.body, Some(node_message::Body::Result(_)))),
            "the result is sent: {sent:?}"
        );
        assert!(
            sent.iter().any(|m| matches!(&m.body, Some(node_message::Body::Credit(c)) if c.kind == "synthetic" && c.slots == 1)),
            "the slot is offered again: {sent:?}"
        );
        assert!(shared.is_poisoned(), "the panic poisoned the shared lock");

        // The next attempt on the same node and the same (poisoned) lock runs normally.
        let second = run_one(&mut node, &mut events, 8).await;
        let o = second.outcome.expect("an outcome");
        assert!(o.success, "{o:?}");
        assert_eq!(
            *shared.lock().unwrap_or_else(|e| e.into_inner()),
            vec![7, 8]
        );
    }

    /// Runs until it is cancelled, then returns nothing.
    struct WaitsForCancel;

    impl Executor for WaitsForCancel {
        fn kind(&self) -> ExecutorKind {
            ExecutorKind::Synthetic
        }
        fn run(&self, _spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
            Box::pin(async move {
                ctx.cancel.cancelled().await;
                AttemptEnd::Cancelled
            })
        }
    }

    /// Waits for the attempt's `Done` event and hands it to the node.
    async fn end_next(node: &mut Node, events: &mut mpsc::UnboundedReceiver<Event>) {
        let done = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("the attempt ends within 30 s")
            .expect("events open");
        node.handle(done);
    }

    #[tokio::test]
    async fn a_revoked_attempt_ends_silently_and_a_drained_one_is_handed_back() {
        let (mut node, mut events, mut out) = node(Arc::new(WaitsForCancel));
        let first = AttemptRef {
            task_id: 1,
            epoch: 1,
        };
        node.handle(grant(1));
        assert_eq!(node.state_of(first), Some(AttemptState::Running));
        node.handle(Event::Inbound {
            generation: 1,
            body: coordinator_message::Body::Revoke(reprobench_proto::v1::Revoke {
                attempt: Some(first),
                reason: "the lease passed to another node".into(),
            }),
        });
        assert_eq!(
            node.state_of(first),
            Some(AttemptState::Stopping(crate::attempt::StopCause::Revoked))
        );
        end_next(&mut node, &mut events).await;
        assert_eq!(node.state_of(first), None, "released and forgotten");
        assert_eq!(node.free[&ExecutorKind::Synthetic], 1);
        let sent: Vec<NodeMessage> = std::iter::from_fn(|| out.try_recv().ok()).collect();
        assert!(
            !sent.iter().any(|m| matches!(
                &m.body,
                Some(node_message::Body::Result(_) | node_message::Body::HandBack(_))
            )),
            "a revoked attempt says nothing: {sent:?}"
        );
        assert!(
            sent.iter()
                .any(|m| matches!(&m.body, Some(node_message::Body::Credit(_)))),
            "its slot is offered again: {sent:?}"
        );

        // Past the drain deadline, a running attempt is stopped and handed back.
        let second = AttemptRef {
            task_id: 2,
            epoch: 1,
        };
        node.handle(grant(2));
        node.start_drain("test");
        assert!(!node.drained(), "an attempt runs");
        node.hand_back_all();
        end_next(&mut node, &mut events).await;
        assert_eq!(node.state_of(second), None);
        assert_eq!(node.held(), Vec::<AttemptRef>::new());
        let sent: Vec<NodeMessage> = std::iter::from_fn(|| out.try_recv().ok()).collect();
        assert!(
            sent.iter().any(|m| matches!(
                &m.body,
                Some(node_message::Body::HandBack(h)) if h.attempt == Some(second)
            )),
            "handed back: {sent:?}"
        );
        assert!(
            !sent
                .iter()
                .any(|m| matches!(&m.body, Some(node_message::Body::Credit(_)))),
            "a draining node offers no slot: {sent:?}"
        );
    }

    #[tokio::test]
    async fn a_draining_node_stops_only_once_the_coordinator_acknowledged_and_runs_a_grant_sent_before()
     {
        let (mut node, mut events, _out) = node(Arc::new(WaitsForCancel));
        node.start_drain("test");
        assert!(!node.drained(), "a grant may still be on its way");
        // A grant the coordinator sent before it saw the drain is run, not refused.
        node.handle(grant(1));
        let first = AttemptRef {
            task_id: 1,
            epoch: 1,
        };
        assert_eq!(node.state_of(first), Some(AttemptState::Running));
        node.handle(Event::Inbound {
            generation: 1,
            body: coordinator_message::Body::DrainingAck(reprobench_proto::v1::DrainingAck {}),
        });
        assert!(!node.drained(), "its attempt runs");
        node.hand_back_all();
        end_next(&mut node, &mut events).await;
        assert!(
            node.drained(),
            "acknowledged, nothing runs, nothing undelivered"
        );
        // Without a connection there is no grant to wait for.
        node.conn = None;
        node.drain_acked = false;
        assert!(node.drained());
    }
}
