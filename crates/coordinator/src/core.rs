//! The coordinator's core: one thread that owns the scheduler, the leases and the store.
//!
//! Everything that changes state arrives here as a [`Command`]. The core takes a batch of
//! commands, applies them inside one SQLite transaction, hands out grants, commits, and only
//! then sends the replies and messages the batch produced. So every acknowledged change is
//! durable (group commit), and the order of events is the order of this one loop.

use crate::lifecycle::{self, Attempt, Ending, Event, ResultContext, ResultVerdict, TaskState};
use crate::scheduler::{NodeIdx, Policy, QueuedTask, Scheduler, TaskId};
use crate::store::{self, LoadedRun, NewTask, ResultRecord, Store, StoreError, state};
use crate::sweep;
use reprobench_domain::sweep::SweepSpec;
use reprobench_domain::time::now_ms;
use reprobench_proto::v1::{
    AttemptRef, CoordinatorMessage, FailureClass, Grant, Hello, LeaseRenewal, ListRunsResponse,
    NodeProgress, Outcome, RegisterRequest, RegisterResponse, ResultAck, Revoke, RunProgress,
    RunSummary, SubmitRunRequest, SubmitRunResponse, coordinator_message, node_message,
};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// Lease and heartbeat timing, and the placement policy.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// A lease lasts this long after its last renewal.
    pub lease_ms: u64,
    /// Nodes heartbeat this often.
    pub heartbeat_ms: u64,
    /// Placement policy (the benchmark's baseline uses `StaticRoundRobin`).
    pub policy: Policy,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            lease_ms: 15_000,
            heartbeat_ms: 3_000,
            policy: Policy::AffinityStealing,
        }
    }
}

/// Sender of messages to one node's Work stream.
pub type NodeSender = mpsc::UnboundedSender<Result<CoordinatorMessage, Status>>;
/// Sender of progress events to one WatchRun stream.
pub type WatchSender = mpsc::Sender<Result<RunProgress, Status>>;

/// Everything the core is asked to do.
pub enum Command {
    /// A node registers.
    Register {
        req: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterResponse, Status>>,
    },
    /// A node opened a Work stream and said hello.
    Connect {
        node_id: String,
        conn: u64,
        hello: Hello,
        out: NodeSender,
    },
    /// A message on a Work stream.
    FromNode {
        node_id: String,
        conn: u64,
        body: node_message::Body,
    },
    /// A Work stream ended.
    Disconnect { node_id: String, conn: u64 },
    /// SubmitRun.
    Submit {
        req: SubmitRunRequest,
        reply: oneshot::Sender<Result<SubmitRunResponse, Status>>,
    },
    /// CancelRun.
    Cancel {
        run_id: String,
        reply: oneshot::Sender<Result<u64, Status>>,
    },
    /// ListRuns.
    List {
        reply: oneshot::Sender<ListRunsResponse>,
    },
    /// WatchRun.
    Watch { run_id: String, tx: WatchSender },
    /// A node is gone for good (Kubernetes deleted its pod, or the pod failed): its attempts are
    /// released at once, as an expired lease would be (same fencing: a later result of the old
    /// epoch is refused), instead of after the lease timeout.
    NodeGone { node_id: String, reason: String },
    /// Pending and leased tasks per executor kind (what autoscalers read).
    Counts {
        reply: oneshot::Sender<Vec<KindCounts>>,
    },
    /// Stop the core (after committing what it has).
    Shutdown,
}

/// Tasks of one executor kind waiting for a slot and holding one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KindCounts {
    /// Executor kind.
    pub kind: String,
    /// Tasks waiting for a slot.
    pub pending: u64,
    /// Tasks leased to a node.
    pub running: u64,
}

/// A cloneable handle to send commands to the core.
#[derive(Clone)]
pub struct CoreHandle {
    tx: std_mpsc::Sender<Command>,
}

impl CoreHandle {
    /// A handle whose commands arrive on the returned receiver instead of a core (for tests of
    /// what sends them).
    #[cfg(test)]
    pub(crate) fn channel() -> (CoreHandle, std_mpsc::Receiver<Command>) {
        let (tx, rx) = std_mpsc::channel();
        (CoreHandle { tx }, rx)
    }

    /// Sends a command; fails when the core has stopped.
    pub fn send(&self, cmd: Command) -> Result<(), Status> {
        self.tx
            .send(cmd)
            .map_err(|_| Status::unavailable("the coordinator is shutting down; retry shortly"))
    }
}

/// Opens the core on a store and starts its thread.
pub fn spawn(
    store: Store,
    cfg: CoreConfig,
) -> Result<(CoreHandle, std::thread::JoinHandle<()>), StoreError> {
    let core = Core::load(store, cfg)?;
    let (tx, rx) = std_mpsc::channel();
    let join = std::thread::Builder::new()
        .name("coordinator-core".into())
        .spawn(move || core.run(rx))
        .expect("spawning the core thread");
    Ok((CoreHandle { tx }, join))
}

struct TaskMem {
    run: Arc<str>,
    state: TaskState,
    epoch: u64,
    infra_failures: u32,
    kind: Arc<str>,
    key: Arc<str>,
    agent: Arc<str>,
    node: Option<NodeIdx>,
    /// The epoch whose result was recorded (for idempotent re-delivery).
    result_epoch: Option<u64>,
}

struct Lease {
    node: NodeIdx,
    epoch: u64,
    deadline: Instant,
    /// When the attempt was granted (epoch ms), if this coordinator granted it.
    granted_ms: Option<i64>,
}

struct RunMem {
    summary: RunSummary,
    sweep_hash: String,
    max_attempts: u32,
    watchers: Vec<WatchSender>,
    node_finished: HashMap<NodeIdx, u64>,
    dirty: bool,
    last_publish: Option<Instant>,
    /// Since this core started: when the first task of the run finished, and how many have.
    session_start: Option<Instant>,
    session_done: u64,
}

struct NodeMem {
    id: String,
    slots: Vec<(String, u32)>,
    conn: Option<(u64, NodeSender)>,
    last_seen: Instant,
    draining: bool,
    credits: HashMap<String, u32>,
    in_sched: bool,
}

enum Effect {
    Node(NodeSender, coordinator_message::Body),
    Reply(Box<dyn FnOnce() + Send>),
}

struct Core {
    cfg: CoreConfig,
    store: Store,
    sched: Scheduler,
    tasks: HashMap<TaskId, TaskMem>,
    runs: HashMap<Arc<str>, RunMem>,
    run_order: Vec<Arc<str>>,
    nodes: Vec<NodeMem>,
    node_index: HashMap<String, NodeIdx>,
    leases: HashMap<TaskId, Lease>,
    /// Nodes with credit that may find work; a node leaves it when nothing fits it right now.
    hungry: BTreeSet<NodeIdx>,
    /// Work was queued since the last dispatch: every node with credit gets to look again.
    work_added: bool,
    strings: HashSet<Arc<str>>,
    effects: Vec<Effect>,
}

impl Core {
    fn load(store: Store, cfg: CoreConfig) -> Result<Core, StoreError> {
        let mut core = Core {
            sched: Scheduler::new(cfg.policy),
            cfg,
            store,
            tasks: HashMap::new(),
            runs: HashMap::new(),
            run_order: Vec::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            leases: HashMap::new(),
            hungry: BTreeSet::new(),
            work_added: false,
            strings: HashSet::new(),
            effects: Vec::new(),
        };
        for run in core.store.load_runs()? {
            core.add_run_mem(&run);
        }
        for (key, agent, wall_s) in core.store.load_durations()? {
            core.sched.record_duration(&key, &agent, wall_s);
        }
        let grace = Instant::now() + Duration::from_millis(core.cfg.lease_ms);
        let mut resumed = 0usize;
        for t in core.store.load_tasks(None)? {
            let run = core.intern(&t.run_id);
            let st = TaskState::parse(&t.state);
            let node = t.node_id.as_deref().map(|n| core.node_idx(n));
            let mem = TaskMem {
                run: run.clone(),
                state: st,
                epoch: t.epoch,
                infra_failures: t.infra_failures,
                kind: core.intern(&t.kind),
                key: core.intern(&t.affinity_key),
                agent: core.intern(&t.agent),
                node,
                result_epoch: None,
            };
            match st {
                TaskState::Pending => {
                    core.sched.enqueue(QueuedTask {
                        id: t.task_id,
                        kind: &mem.kind,
                        key: &mem.key,
                        agent: &mem.agent,
                    });
                    resumed += 1;
                }
                TaskState::Leased => {
                    // Leases are not persisted: every lease held at the crash gets a fresh one, so its
                    // node can reconnect and claim it before it is requeued.
                    let node = node.expect("a leased task has a node");
                    core.leases.insert(
                        t.task_id,
                        Lease {
                            node,
                            epoch: t.epoch,
                            deadline: grace,
                            granted_ms: None,
                        },
                    );
                    resumed += 1;
                }
                _ => {}
            }
            if let Some(r) = core.runs.get_mut(&run) {
                bump(&mut r.summary, st, 1);
            }
            core.tasks.insert(t.task_id, mem);
        }
        if resumed > 0 {
            tracing::info!(tasks = resumed, "resuming unfinished work from the store");
        }
        Ok(core)
    }

    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.strings.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.strings.insert(a.clone());
        a
    }

    fn node_idx(&mut self, id: &str) -> NodeIdx {
        if let Some(&i) = self.node_index.get(id) {
            return i;
        }
        let i = self.nodes.len() as NodeIdx;
        self.nodes.push(NodeMem {
            id: id.to_string(),
            slots: Vec::new(),
            conn: None,
            last_seen: Instant::now(),
            draining: false,
            credits: HashMap::new(),
            in_sched: false,
        });
        self.node_index.insert(id.to_string(), i);
        i
    }

    fn add_run_mem(&mut self, run: &LoadedRun) {
        let id = self.intern(&run.run_id);
        self.run_order.push(id.clone());
        self.runs.insert(
            id,
            RunMem {
                summary: RunSummary {
                    run_id: run.run_id.clone(),
                    name: run.name.clone(),
                    state: run.state.clone(),
                    tasks: run.tasks,
                    created_at_ms: run.created_at_ms,
                    finished_at_ms: run.finished_at_ms.unwrap_or(0),
                    ..Default::default()
                },
                sweep_hash: run.sweep_hash.clone(),
                max_attempts: run.max_attempts,
                watchers: Vec::new(),
                node_finished: HashMap::new(),
                dirty: true,
                last_publish: None,
                session_start: None,
                session_done: 0,
            },
        );
    }

    fn run(mut self, rx: std_mpsc::Receiver<Command>) {
        let tick = Duration::from_millis((self.cfg.lease_ms / 10).clamp(20, 100));
        let mut next_tick = Instant::now() + tick;
        let mut batch = Vec::new();
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(c) => batch.push(c),
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            while batch.len() < 4096 {
                match rx.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            let shutdown = batch.iter().any(|c| matches!(c, Command::Shutdown));
            if let Err(e) = self.step(&mut batch, &mut next_tick, tick) {
                // A failed write leaves memory ahead of the store: stop, and let a restart resume
                // from what was committed.
                tracing::error!(error = %e, "store write failed; the coordinator stops");
                eprintln!("reprobench coordinator: store write failed: {e}");
                std::process::exit(74);
            }
            if shutdown {
                return;
            }
        }
    }

    fn step(
        &mut self,
        batch: &mut Vec<Command>,
        next_tick: &mut Instant,
        tick: Duration,
    ) -> Result<(), StoreError> {
        self.store.begin()?;
        for cmd in batch.drain(..) {
            self.apply(cmd)?;
        }
        let now = Instant::now();
        if now >= *next_tick {
            self.tick(now)?;
            *next_tick = now + tick;
        }
        self.dispatch()?;
        self.store.commit()?;
        for effect in self.effects.drain(..) {
            match effect {
                Effect::Node(tx, body) => {
                    let _ = tx.send(Ok(CoordinatorMessage { body: Some(body) }));
                }
                Effect::Reply(f) => f(),
            }
        }
        self.publish(now);
        Ok(())
    }

    fn reply<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, value: T) {
        self.effects.push(Effect::Reply(Box::new(move || {
            let _ = tx.send(value);
        })));
    }

    fn send_to_node(&mut self, node: NodeIdx, body: coordinator_message::Body) {
        if let Some((_, tx)) = &self.nodes[node as usize].conn {
            self.effects.push(Effect::Node(tx.clone(), body));
        }
    }

    fn apply(&mut self, cmd: Command) -> Result<(), StoreError> {
        match cmd {
            Command::Register { req, reply } => self.register(req, reply),
            Command::Connect {
                node_id,
                conn,
                hello,
                out,
            } => self.connect(node_id, conn, hello, out),
            Command::FromNode {
                node_id,
                conn,
                body,
            } => self.on_node_message(&node_id, conn, body),
            Command::Disconnect { node_id, conn } => {
                if let Some(&n) = self.node_index.get(&node_id)
                    && self.nodes[n as usize]
                        .conn
                        .as_ref()
                        .is_some_and(|(c, _)| *c == conn)
                {
                    tracing::info!(node = %node_id, "node disconnected; its leases run until they expire");
                    self.nodes[n as usize].conn = None;
                    self.nodes[n as usize].credits.clear();
                    self.leave_sched(n);
                }
                Ok(())
            }
            Command::Submit { req, reply } => {
                let result = self.submit(req)?;
                self.reply(reply, result);
                Ok(())
            }
            Command::Cancel { run_id, reply } => {
                let result = self.cancel(&run_id)?;
                self.reply(reply, result);
                Ok(())
            }
            Command::List { reply } => {
                let runs = self
                    .run_order
                    .iter()
                    .map(|r| self.runs[r].summary.clone())
                    .collect();
                let live_nodes = self.nodes.iter().filter(|n| n.in_sched).count() as u32;
                self.reply(reply, ListRunsResponse { runs, live_nodes });
                Ok(())
            }
            Command::Watch { run_id, tx } => {
                match self.runs.get_mut(run_id.as_str()) {
                    Some(run) => {
                        run.watchers.push(tx);
                        run.dirty = true;
                        run.last_publish = None;
                    }
                    None => {
                        let _ = tx.try_send(Err(Status::not_found(format!(
                            "no run `{run_id}`; `reprobench status` lists the runs"
                        ))));
                    }
                }
                Ok(())
            }
            Command::NodeGone { node_id, reason } => self.node_gone(&node_id, &reason),
            Command::Counts { reply } => {
                let counts = self.kind_counts();
                self.reply(reply, counts);
                Ok(())
            }
            Command::Shutdown => Ok(()),
        }
    }

    fn kind_counts(&self) -> Vec<KindCounts> {
        let mut by_kind: std::collections::BTreeMap<&str, KindCounts> = Default::default();
        for t in self.tasks.values() {
            let (pending, running) = match t.state {
                TaskState::Pending => (1, 0),
                TaskState::Leased => (0, 1),
                _ => continue,
            };
            let c = by_kind.entry(&t.kind).or_insert_with(|| KindCounts {
                kind: t.kind.to_string(),
                ..KindCounts::default()
            });
            c.pending += pending;
            c.running += running;
        }
        // Kinds the nodes offer appear even with nothing to do (a scaler reads zeros, not gaps).
        for node in &self.nodes {
            for (kind, _) in &node.slots {
                by_kind.entry(kind.as_str()).or_insert_with(|| KindCounts {
                    kind: kind.clone(),
                    ..KindCounts::default()
                });
            }
        }
        by_kind.into_values().collect()
    }

    fn node_gone(&mut self, node_id: &str, reason: &str) -> Result<(), StoreError> {
        let Some(&n) = self.node_index.get(node_id) else {
            return Ok(());
        };
        // No more grants, even for credits it still sends while it dies (it counts as draining
        // until it connects anew: a new pod of the same name does); should it still be
        // connected, the revokes tell it, and fencing refuses its late results.
        self.nodes[n as usize].credits.clear();
        self.nodes[n as usize].draining = true;
        self.leave_sched(n);
        let held: Vec<(TaskId, u64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.node == n)
            .map(|(t, l)| (*t, l.epoch))
            .collect();
        if !held.is_empty() {
            tracing::warn!(node = %node_id, attempts = held.len(), %reason, "node gone; releasing its leases now");
        }
        for (task, epoch) in held {
            let why = format!("{reason}; the attempt is requeued without waiting for its lease");
            self.release_lease(task, n, epoch, "node_gone", why)?;
        }
        Ok(())
    }

    /// Ends the attempt `epoch` of `task` that node `n` held (`status` in the store), tells the
    /// node in case it still listens, and retries the task or closes it at the bound.
    fn release_lease(
        &mut self,
        task: TaskId,
        n: NodeIdx,
        epoch: u64,
        status: &str,
        reason: String,
    ) -> Result<(), StoreError> {
        self.leases.remove(&task);
        let node_id = self.nodes[n as usize].id.clone();
        self.store
            .end_attempt(task, epoch, status, Some(&reason), now_ms())?;
        let attempt = Some(AttemptRef {
            task_id: task,
            epoch,
        });
        self.send_to_node(
            n,
            coordinator_message::Body::Revoke(Revoke {
                attempt,
                reason: reason.clone(),
            }),
        );
        self.infra_failure(task, status, reason, &node_id)
    }

    fn register(
        &mut self,
        req: RegisterRequest,
        reply: oneshot::Sender<Result<RegisterResponse, Status>>,
    ) -> Result<(), StoreError> {
        if req.protocol_version != reprobench_proto::PROTOCOL_VERSION {
            let msg = format!(
                "node `{}` speaks protocol v{} but this coordinator speaks v{}; run the same reprobench release on the coordinator and its nodes",
                req.node_id,
                req.protocol_version,
                reprobench_proto::PROTOCOL_VERSION
            );
            self.reply(reply, Err(Status::failed_precondition(msg)));
            return Ok(());
        }
        let bad = |m: String| Err(Status::invalid_argument(m));
        let check = if req.node_id.trim().is_empty() {
            bad("node_id is empty; pass --name or let the node choose one".into())
        } else if req.slots.is_empty() {
            bad(format!(
                "node `{}` offers no slots; pass --slots KIND=N",
                req.node_id
            ))
        } else {
            Ok(())
        };
        if let Err(e) = check {
            self.reply(reply, Err(e));
            return Ok(());
        }
        let slots: Vec<(String, u32)> = req
            .slots
            .iter()
            .map(|s| (s.kind.clone(), s.slots))
            .collect();
        let slots_text = slots
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(",");
        self.store
            .upsert_node(&req.node_id, &req.hostname, &slots_text, now_ms())?;
        let n = self.node_idx(&req.node_id);
        if self.nodes[n as usize].slots != slots {
            self.leave_sched(n);
            self.nodes[n as usize].slots = slots;
        }
        tracing::info!(node = %req.node_id, host = %req.hostname, slots = %slots_text, "node registered");
        let resp = RegisterResponse {
            node_id: req.node_id,
            protocol_version: reprobench_proto::PROTOCOL_VERSION,
            lease_ms: self.cfg.lease_ms,
            heartbeat_ms: self.cfg.heartbeat_ms,
        };
        self.reply(reply, Ok(resp));
        Ok(())
    }

    fn connect(
        &mut self,
        node_id: String,
        conn: u64,
        hello: Hello,
        out: NodeSender,
    ) -> Result<(), StoreError> {
        let Some(&n) = self
            .node_index
            .get(&node_id)
            .filter(|&&n| !self.nodes[n as usize].slots.is_empty())
        else {
            let _ = out.send(Err(Status::failed_precondition(format!(
                "node `{node_id}` opened a Work stream without registering; call Register first"
            ))));
            return Ok(());
        };
        {
            let node = &mut self.nodes[n as usize];
            node.conn = Some((conn, out));
            node.last_seen = Instant::now();
            node.draining = hello.draining;
            node.credits = hello
                .free
                .iter()
                .map(|s| (s.kind.clone(), s.slots))
                .collect();
        }
        for key in &hello.warm_keys {
            self.sched.mark_warm(n, key);
        }
        // Leases this node held that it no longer reports were lost in transit: requeue them now.
        let held: HashSet<(u64, u64)> =
            hello.running.iter().map(|a| (a.task_id, a.epoch)).collect();
        let lost: Vec<(TaskId, u64)> = self
            .leases
            .iter()
            .filter(|(t, l)| l.node == n && !held.contains(&(**t, l.epoch)))
            .map(|(t, l)| (*t, l.epoch))
            .collect();
        for (task, epoch) in lost {
            self.leases.remove(&task);
            let reason =
                format!("node {node_id} reconnected without this attempt (grant lost in transit)");
            self.store
                .end_attempt(task, epoch, "lost", Some(&reason), now_ms())?;
            self.requeue(task)?;
        }
        self.renew(n, &hello.running);
        if !hello.draining {
            self.join_sched(n);
        }
        tracing::info!(node = %node_id, running = hello.running.len(), "node connected");
        Ok(())
    }

    fn on_node_message(
        &mut self,
        node_id: &str,
        conn: u64,
        body: node_message::Body,
    ) -> Result<(), StoreError> {
        let Some(&n) = self.node_index.get(node_id) else {
            return Ok(());
        };
        if self.nodes[n as usize]
            .conn
            .as_ref()
            .is_none_or(|(c, _)| *c != conn)
        {
            return Ok(()); // a superseded stream
        }
        self.nodes[n as usize].last_seen = Instant::now();
        if !self.nodes[n as usize].in_sched && !self.nodes[n as usize].draining {
            self.join_sched(n);
        }
        match body {
            node_message::Body::Hello(_) => {}
            node_message::Body::Heartbeat(hb) => self.renew(n, &hb.running),
            node_message::Body::Credit(c) => {
                if !self.nodes[n as usize].draining {
                    *self.nodes[n as usize].credits.entry(c.kind).or_insert(0) += c.slots;
                    self.hungry.insert(n);
                }
            }
            node_message::Body::Progress(_) => {}
            node_message::Body::Result(r) => {
                let attempt = r.attempt.unwrap_or_default();
                self.result(n, attempt, r.outcome.unwrap_or_default())?;
            }
            node_message::Body::HandBack(h) => {
                let a = h.attempt.unwrap_or_default();
                if self
                    .leases
                    .get(&a.task_id)
                    .is_some_and(|l| l.node == n && l.epoch == a.epoch)
                {
                    self.leases.remove(&a.task_id);
                    let reason = format!("handed back by {node_id}: {}", h.reason);
                    self.store.end_attempt(
                        a.task_id,
                        a.epoch,
                        "handed_back",
                        Some(&reason),
                        now_ms(),
                    )?;
                    self.requeue(a.task_id)?;
                }
            }
            node_message::Body::Draining(_) => {
                tracing::info!(node = %node_id, "node is draining");
                self.nodes[n as usize].draining = true;
                self.nodes[n as usize].credits.clear();
                self.leave_sched(n);
            }
        }
        Ok(())
    }

    /// Extends the leases a node reports; revokes what it runs without a lease.
    fn renew(&mut self, n: NodeIdx, running: &[AttemptRef]) {
        let deadline = Instant::now() + Duration::from_millis(self.cfg.lease_ms);
        let mut renewed = Vec::new();
        for a in running {
            match self.leases.get_mut(&a.task_id) {
                Some(l) if l.node == n && l.epoch == a.epoch => {
                    l.deadline = deadline;
                    renewed.push(*a);
                }
                _ => {
                    let epoch = self.tasks.get(&a.task_id).map_or(0, |t| t.epoch);
                    let reason =
                        format!("lease lost: the task is now at attempt {epoch} or closed");
                    self.send_to_node(
                        n,
                        coordinator_message::Body::Revoke(Revoke {
                            attempt: Some(*a),
                            reason,
                        }),
                    );
                }
            }
        }
        let lease_ms = self.cfg.lease_ms;
        self.send_to_node(
            n,
            coordinator_message::Body::Renewal(LeaseRenewal { renewed, lease_ms }),
        );
    }

    fn join_sched(&mut self, n: NodeIdx) {
        let node = &mut self.nodes[n as usize];
        if node.in_sched || node.slots.is_empty() || node.conn.is_none() {
            return;
        }
        node.in_sched = true;
        let kinds: Vec<String> = node.slots.iter().map(|(k, _)| k.clone()).collect();
        self.sched.add_node(n, &kinds);
        self.hungry.insert(n);
    }

    fn leave_sched(&mut self, n: NodeIdx) {
        if std::mem::take(&mut self.nodes[n as usize].in_sched) {
            self.sched.remove_node(n);
        }
    }

    fn submit(
        &mut self,
        req: SubmitRunRequest,
    ) -> Result<Result<SubmitRunResponse, Status>, StoreError> {
        let spec = match SweepSpec::from_toml(&req.sweep_toml) {
            Ok(s) => s,
            Err(e) => return Ok(Err(Status::invalid_argument(e.to_string()))),
        };
        let attachments: sweep::Attachments = req.attachments.into_iter().collect();
        let hash = sweep::sweep_hash(&spec, &attachments);
        if req.resume_existing {
            let existing = self.run_order.iter().rev().find(|r| {
                let run = &self.runs[*r];
                run.sweep_hash == hash
                    && (run.summary.state == "running"
                        || req.reuse_finished && run.summary.state == "finished")
            });
            if let Some(r) = existing {
                let run = &self.runs[r];
                return Ok(Ok(SubmitRunResponse {
                    run_id: r.to_string(),
                    tasks: run.summary.tasks,
                    resumed: true,
                }));
            }
        }
        let tasks: Vec<NewTask> = match sweep::expand(&spec, &attachments) {
            Ok(t) => t,
            Err(e) => return Ok(Err(Status::invalid_argument(e.to_string()))),
        };
        let created = now_ms();
        let run = LoadedRun {
            run_id: new_run_id(created),
            name: spec.name.clone(),
            sweep_hash: hash,
            state: "running".into(),
            tasks: tasks.len() as u64,
            max_attempts: spec.max_attempts,
            created_at_ms: created,
            finished_at_ms: None,
        };
        let attachments_json =
            serde_json::to_string(&attachments).expect("a string map serializes");
        let ids = self
            .store
            .insert_run(&run, &spec.to_toml(), &attachments_json, &tasks)?;
        self.add_run_mem(&run);
        let run_key = self.intern(&run.run_id);
        for (id, t) in ids.iter().zip(&tasks) {
            let mem = TaskMem {
                run: run_key.clone(),
                state: TaskState::Pending,
                epoch: 0,
                infra_failures: 0,
                kind: self.intern(&t.kind),
                key: self.intern(&t.affinity_key),
                agent: self.intern(&t.agent),
                node: None,
                result_epoch: None,
            };
            self.sched.enqueue(QueuedTask {
                id: *id,
                kind: &mem.kind,
                key: &mem.key,
                agent: &mem.agent,
            });
            self.tasks.insert(*id, mem);
        }
        self.work_added = true;
        let r = self.runs.get_mut(&run_key).expect("just added");
        r.summary.pending = tasks.len() as u64;
        if tasks.is_empty() {
            self.check_finished(&run_key)?;
        }
        tracing::info!(run = %run.run_id, tasks = tasks.len(), sweep = %spec.name, "run submitted");
        Ok(Ok(SubmitRunResponse {
            run_id: run.run_id,
            tasks: tasks.len() as u64,
            resumed: false,
        }))
    }

    fn cancel(&mut self, run_id: &str) -> Result<Result<u64, Status>, StoreError> {
        let Some(run_key) = self.runs.get_key_value(run_id).map(|(k, _)| k.clone()) else {
            return Ok(Err(Status::not_found(format!(
                "no run `{run_id}`; `reprobench status` lists the runs"
            ))));
        };
        let ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.run == run_key && matches!(t.state, TaskState::Pending | TaskState::Leased)
            })
            .map(|(id, _)| *id)
            .collect();
        let now = now_ms();
        for &id in &ids {
            let (st, epoch, node) = {
                let t = &self.tasks[&id];
                (t.state, t.epoch, t.node)
            };
            if st == TaskState::Pending {
                self.sched.remove(id);
            } else if let (Some(n), Some(_)) = (node, self.leases.remove(&id)) {
                self.store
                    .end_attempt(id, epoch, "cancelled", Some("run cancelled"), now)?;
                let attempt = Some(AttemptRef { task_id: id, epoch });
                self.send_to_node(
                    n,
                    coordinator_message::Body::Cancel(Revoke {
                        attempt,
                        reason: "run cancelled".into(),
                    }),
                );
            }
            let infra = self.tasks[&id].infra_failures;
            if let Some(st) = self.advance(id, Event::Cancel) {
                self.store.set_task_state(id, st.as_str(), infra)?;
            }
        }
        let run = self.runs.get_mut(&run_key).expect("exists");
        if run.summary.state == "running" {
            run.summary.state = "cancelled".into();
            run.summary.finished_at_ms = now;
            run.dirty = true;
            self.store.set_run_state(run_id, "cancelled", Some(now))?;
        }
        Ok(Ok(ids.len() as u64))
    }

    /// Moves `task` through the lifecycle table and counts it in its run; an event its state
    /// does not allow is refused (logged, nothing changes) and gives `None`.
    fn advance(&mut self, task: TaskId, event: Event) -> Option<TaskState> {
        let t = self.tasks.get_mut(&task).expect("known task");
        let new = match lifecycle::next(t.state, event) {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(task, error = %e, "illegal task transition refused");
                return None;
            }
        };
        let old = std::mem::replace(&mut t.state, new);
        let run = self.runs.get_mut(&t.run).expect("task's run");
        bump(&mut run.summary, old, -1);
        bump(&mut run.summary, new, 1);
        run.dirty = true;
        Some(new)
    }

    /// Puts a task whose attempt was lost back in the queue.
    fn requeue(&mut self, task: TaskId) -> Result<(), StoreError> {
        if self
            .advance(task, Event::AttemptLost { retry: true })
            .is_none()
        {
            return Ok(());
        }
        self.work_added = true;
        let t = self.tasks.get_mut(&task).expect("known task");
        t.node = None;
        let infra = t.infra_failures;
        self.sched.enqueue(QueuedTask {
            id: task,
            kind: &t.kind,
            key: &t.key,
            agent: &t.agent,
        });
        self.runs
            .get_mut(&t.run)
            .expect("run")
            .summary
            .retried_attempts += 1;
        self.store.set_task_state(task, state::PENDING, infra)?;
        Ok(())
    }

    /// An attempt failed for infrastructure reasons: retry it, or close the task when the bound is hit.
    fn infra_failure(
        &mut self,
        task: TaskId,
        class: &str,
        message: String,
        node: &str,
    ) -> Result<(), StoreError> {
        let t = self.tasks.get_mut(&task).expect("known task");
        t.infra_failures += 1;
        let max = self.runs[&t.run].max_attempts;
        let event = lifecycle::attempt_lost(t.infra_failures, max);
        if event == (Event::AttemptLost { retry: true }) {
            return self.requeue(task);
        }
        let now = now_ms();
        let record = ResultRecord {
            success: false,
            verdict: "error".into(),
            error_class: Some(format!("infra:{class}")),
            error_message: Some(format!("gave up after {max} attempts; last: {message}")),
            started_at_ms: now,
            finished_at_ms: now,
            node_id: node.to_string(),
            ..Default::default()
        };
        self.finish(task, event, &record)
    }

    /// Ends a task by `event` with its one result row.
    fn finish(
        &mut self,
        task: TaskId,
        event: Event,
        record: &ResultRecord,
    ) -> Result<(), StoreError> {
        let Some(st) = self.advance(task, event) else {
            return Ok(());
        };
        let t = self.tasks.get_mut(&task).expect("known task");
        t.result_epoch = Some(t.epoch);
        let (run, epoch, infra, node) = (t.run.clone(), t.epoch, t.infra_failures, t.node);
        self.store.insert_result(task, &run, epoch, record)?;
        self.store.set_task_state(task, st.as_str(), infra)?;
        let r = self.runs.get_mut(&run).expect("run");
        if let Some(n) = node {
            *r.node_finished.entry(n).or_insert(0) += 1;
        }
        r.session_done += 1;
        self.check_finished(&run)
    }

    fn check_finished(&mut self, run: &Arc<str>) -> Result<(), StoreError> {
        let r = self.runs.get_mut(run).expect("run");
        if r.summary.state == "running" && r.summary.pending == 0 && r.summary.running == 0 {
            let now = now_ms();
            r.summary.state = "finished".into();
            r.summary.finished_at_ms = now;
            r.dirty = true;
            tracing::info!(run = %run, succeeded = r.summary.succeeded, failed = r.summary.failed, errored = r.summary.errored, "run finished");
            self.store.set_run_state(run, "finished", Some(now))?;
        }
        Ok(())
    }

    fn result(&mut self, n: NodeIdx, a: AttemptRef, outcome: Outcome) -> Result<(), StoreError> {
        let node_id = self.nodes[n as usize].id.clone();
        let ack = |accepted: bool, reason: String| {
            coordinator_message::Body::ResultAck(ResultAck {
                attempt: Some(a),
                accepted,
                reason,
            })
        };
        let Some(t) = self.tasks.get(&a.task_id) else {
            self.send_to_node(n, ack(false, "unknown task".into()));
            return Ok(());
        };
        let context = ResultContext {
            state: t.state,
            epoch: t.epoch,
            lease: self.leases.get(&a.task_id).map(|l| Attempt {
                node: l.node,
                epoch: l.epoch,
            }),
            recorded: t
                .result_epoch
                .zip(t.node)
                .map(|(epoch, node)| Attempt { node, epoch }),
        };
        match lifecycle::judge_result(
            &context,
            Attempt {
                node: n,
                epoch: a.epoch,
            },
        ) {
            ResultVerdict::Accept => {}
            ResultVerdict::Duplicate => {
                self.send_to_node(n, ack(true, "already recorded".into()));
                return Ok(());
            }
            ResultVerdict::Refuse(reason) => {
                tracing::warn!(task = a.task_id, epoch = a.epoch, node = %node_id, %reason, "late result rejected");
                self.store.mark_late_result(a.task_id, a.epoch, now_ms())?;
                self.send_to_node(n, ack(false, reason));
                return Ok(());
            }
        }
        let granted_ms = self.leases.remove(&a.task_id).and_then(|l| l.granted_ms);
        let now = now_ms();
        let mut outcome = outcome;
        // Executors that fail early (a bad payload, a sandbox error) send no times of their own.
        if outcome.started_at_ms == 0 {
            outcome.started_at_ms = granted_ms.unwrap_or(now);
        }
        if outcome.finished_at_ms == 0 {
            outcome.finished_at_ms = now;
        }
        let class = FailureClass::try_from(outcome.failure_class).unwrap_or(FailureClass::Infra);
        if class == FailureClass::Infra {
            let message = if outcome.error_message.is_empty() {
                "infrastructure error".into()
            } else {
                outcome.error_message.clone()
            };
            self.store
                .end_attempt(a.task_id, a.epoch, "infra_error", Some(&message), now)?;
            let cls = if outcome.error_class.is_empty() {
                "executor".to_string()
            } else {
                outcome.error_class.clone()
            };
            self.infra_failure(a.task_id, &cls, message, &node_id)?;
        } else {
            let errored = class != FailureClass::None || !outcome.error_class.is_empty();
            let reason = errored.then(|| {
                match (
                    outcome.error_class.is_empty(),
                    outcome.error_message.is_empty(),
                ) {
                    (false, false) => format!("{}: {}", outcome.error_class, outcome.error_message),
                    (false, true) => outcome.error_class.clone(),
                    _ => outcome.error_message.clone(),
                }
            });
            self.store
                .end_attempt(a.task_id, a.epoch, "finished", reason.as_deref(), now)?;
            let ending = if outcome.success {
                Ending::Succeeded
            } else if errored {
                Ending::Errored
            } else {
                Ending::Failed
            };
            if !errored {
                let t = &self.tasks[&a.task_id];
                let (key, agent) = (t.key.clone(), t.agent.clone());
                self.sched.record_duration(&key, &agent, outcome.wall_s);
            }
            let record = record_from(outcome, node_id);
            self.finish(a.task_id, Event::Finished(ending), &record)?;
        }
        self.send_to_node(n, ack(true, String::new()));
        Ok(())
    }

    fn tick(&mut self, now: Instant) -> Result<(), StoreError> {
        let silence = Duration::from_millis(self.cfg.lease_ms);
        for n in 0..self.nodes.len() as NodeIdx {
            let node = &self.nodes[n as usize];
            if node.in_sched && now.duration_since(node.last_seen) > silence {
                tracing::warn!(node = %node.id, "node silent for a lease period; no more grants until it speaks");
                self.leave_sched(n);
            }
        }
        let expired: Vec<(TaskId, NodeIdx, u64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(t, l)| (*t, l.node, l.epoch))
            .collect();
        for (task, n, epoch) in expired {
            let node_id = &self.nodes[n as usize].id;
            let reason = format!(
                "lease expired: no heartbeat from {node_id} for {} ms",
                self.cfg.lease_ms
            );
            tracing::warn!(task, epoch, node = %node_id, "lease expired; requeueing");
            self.release_lease(task, n, epoch, "lease_expired", reason)?;
        }
        Ok(())
    }

    /// Grants pending work to nodes that asked for it, one task per node per round.
    fn dispatch(&mut self) -> Result<(), StoreError> {
        if std::mem::take(&mut self.work_added) {
            for (i, node) in self.nodes.iter().enumerate() {
                if node.in_sched && node.credits.values().any(|c| *c > 0) {
                    self.hungry.insert(i as NodeIdx);
                }
            }
        }
        while self.sched.pending() > 0 && !self.hungry.is_empty() {
            let mut granted_any = false;
            let hungry: Vec<NodeIdx> = self.hungry.iter().copied().collect();
            for n in hungry {
                let node = &self.nodes[n as usize];
                // Every kind it has a free slot of, in a fixed order: a node offering several
                // kinds gets work of any of them, not only of the one it happens to list first.
                let mut kinds: Vec<String> = node
                    .credits
                    .iter()
                    .filter(|(_, c)| **c > 0)
                    .map(|(k, _)| k.clone())
                    .collect();
                kinds.sort();
                if kinds.is_empty() || !node.in_sched {
                    self.hungry.remove(&n);
                    continue;
                }
                let picked = kinds
                    .into_iter()
                    .find_map(|kind| self.sched.next_for(n, &kind).map(|pick| (kind, pick)));
                match picked {
                    Some((kind, pick)) => {
                        *self.nodes[n as usize]
                            .credits
                            .get_mut(&kind)
                            .expect("credit") -= 1;
                        self.grant(n, pick.task)?;
                        granted_any = true;
                    }
                    // Nothing of its kinds for it now; it keeps its credits for later work.
                    None => {
                        self.hungry.remove(&n);
                    }
                }
            }
            if !granted_any {
                break;
            }
        }
        Ok(())
    }

    fn grant(&mut self, n: NodeIdx, task: TaskId) -> Result<(), StoreError> {
        if self.advance(task, Event::Grant).is_none() {
            return Ok(());
        }
        let t = self.tasks.get_mut(&task).expect("known task");
        t.epoch += 1;
        t.node = Some(n);
        let (epoch, run, kind, key, agent) = (
            t.epoch,
            t.run.clone(),
            t.kind.clone(),
            t.key.clone(),
            t.agent.clone(),
        );
        let node_id = self.nodes[n as usize].id.clone();
        self.store.record_grant(task, epoch, &node_id, now_ms())?;
        let info = self.store.grant_info(task)?;
        let r = self.runs.get_mut(&run).expect("run");
        r.session_start.get_or_insert_with(Instant::now);
        let deadline = Instant::now() + Duration::from_millis(self.cfg.lease_ms);
        self.leases.insert(
            task,
            Lease {
                node: n,
                epoch,
                deadline,
                granted_ms: Some(now_ms()),
            },
        );
        let grant = Grant {
            attempt: Some(AttemptRef {
                task_id: task,
                epoch,
            }),
            run_id: run.to_string(),
            kind: kind.to_string(),
            affinity_key: key.to_string(),
            agent: agent.to_string(),
            variant: info.variant,
            instance_id: info.instance_id,
            payload_json: info.payload,
            lease_ms: self.cfg.lease_ms,
            attempt_number: epoch as u32,
        };
        self.send_to_node(n, coordinator_message::Body::Grant(grant));
        Ok(())
    }

    /// Sends progress snapshots to watchers, at most every 100 ms per run, and closes finished watches.
    fn publish(&mut self, now: Instant) {
        let run_ids: Vec<Arc<str>> = self
            .runs
            .iter()
            .filter(|(_, r)| r.dirty && !r.watchers.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for id in run_ids {
            let r = &self.runs[&id];
            let done = r.summary.state != "running";
            if !done
                && r.last_publish
                    .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
            {
                continue;
            }
            let progress = self.progress(&id);
            let r = self.runs.get_mut(&id).expect("run");
            r.watchers.retain(|w| {
                !matches!(
                    w.try_send(Ok(progress.clone())),
                    Err(mpsc::error::TrySendError::Closed(_))
                )
            });
            r.dirty = false;
            r.last_publish = Some(now);
            if done {
                r.watchers.clear();
            }
        }
    }

    fn progress(&self, id: &Arc<str>) -> RunProgress {
        let r = &self.runs[id];
        let mut running: HashMap<NodeIdx, u64> = HashMap::new();
        for (task, lease) in &self.leases {
            if self.tasks.get(task).is_some_and(|t| &t.run == id) {
                *running.entry(lease.node).or_insert(0) += 1;
            }
        }
        let nodes = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, node)| {
                let i = i as NodeIdx;
                let running = running.get(&i).copied().unwrap_or(0);
                let finished = r.node_finished.get(&i).copied().unwrap_or(0);
                (node.in_sched || running > 0 || finished > 0).then(|| NodeProgress {
                    node_id: node.id.clone(),
                    live: node.in_sched,
                    running,
                    finished,
                    slots: node.slots.iter().map(|(_, s)| *s).sum(),
                })
            })
            .collect();
        let s = &r.summary;
        let remaining = s.pending + s.running;
        let eta_s = match r.session_start {
            Some(start) if r.session_done > 0 => {
                start.elapsed().as_secs_f64() / r.session_done as f64 * remaining as f64
            }
            _ if remaining == 0 => 0.0,
            _ => -1.0,
        };
        RunProgress {
            run: Some(s.clone()),
            nodes,
            eta_s,
        }
    }
}

fn bump(s: &mut RunSummary, st: TaskState, delta: i64) {
    let field = match st {
        TaskState::Pending => &mut s.pending,
        TaskState::Leased => &mut s.running,
        TaskState::Succeeded => &mut s.succeeded,
        TaskState::Failed => &mut s.failed,
        TaskState::Errored => &mut s.errored,
        TaskState::Cancelled => &mut s.cancelled,
    };
    *field = field.saturating_add_signed(delta);
}

fn record_from(o: Outcome, node_id: String) -> ResultRecord {
    let opt = |s: String| (!s.is_empty()).then_some(s);
    ResultRecord {
        success: o.success,
        verdict: o.verdict,
        error_class: opt(o.error_class),
        error_message: opt(o.error_message),
        llm_calls: o.llm_calls,
        tokens_in: o.tokens_in,
        tokens_out: o.tokens_out,
        tokens_cached: o.tokens_cached,
        cost_usd: o.cost_usd,
        wall_s: o.wall_s,
        actions: o.actions,
        trace_len: o.trace_len,
        feedback_iterations: o.feedback_iterations,
        localized_files_correct: o.localized_files_correct,
        started_at_ms: o.started_at_ms,
        finished_at_ms: o.finished_at_ms,
        node_id,
        artifact_path: o.artifact_path,
        details_json: opt(o.details_json),
    }
}

fn new_run_id(created_ms: i64) -> String {
    let stamp = reprobench_domain::time::rfc3339_ms(created_ms);
    // 2026-11-30T08:51:57.123Z -> 20261130-085157
    let compact: String = stamp
        .chars()
        .filter(|c| c.is_ascii_digit())
        .take(14)
        .collect();
    format!(
        "run-{}-{}-{}",
        &compact[..8],
        &compact[8..],
        crate::random_hex(3)
    )
}

/// Store states that count as a finished task.
pub fn is_terminal(state_name: &str) -> bool {
    matches!(
        state_name,
        store::state::SUCCEEDED
            | store::state::FAILED
            | store::state::ERRORED
            | store::state::CANCELLED
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_proto::v1::{Credit, Heartbeat, SlotCount};

    /// A core on a temporary store, with one fake node's channels.
    struct Harness {
        _dir: tempfile::TempDir,
        core: CoreHandle,
        join: Option<std::thread::JoinHandle<()>>,
        out: mpsc::UnboundedReceiver<Result<CoordinatorMessage, Status>>,
    }

    fn ask<T>(core: &CoreHandle, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (tx, rx) = oneshot::channel();
        core.send(make(tx)).unwrap();
        rx.blocking_recv().unwrap()
    }

    impl Harness {
        fn new(lease_ms: u64) -> Harness {
            Harness::with_slots(lease_ms, &[("synthetic", 4)], &[("synthetic", 1)])
        }

        /// A node `n` registered with `registered` slots whose hello offers `free` of them.
        fn with_slots(lease_ms: u64, registered: &[(&str, u32)], free: &[(&str, u32)]) -> Harness {
            let slots = |list: &[(&str, u32)]| -> Vec<SlotCount> {
                list.iter()
                    .map(|(kind, slots)| SlotCount {
                        kind: kind.to_string(),
                        slots: *slots,
                    })
                    .collect()
            };
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let cfg = CoreConfig {
                lease_ms,
                heartbeat_ms: lease_ms / 4,
                policy: Policy::AffinityStealing,
            };
            let (core, join) = spawn(store, cfg).unwrap();
            let req = RegisterRequest {
                protocol_version: reprobench_proto::PROTOCOL_VERSION,
                node_id: "n".into(),
                hostname: "h".into(),
                slots: slots(registered),
                binary_version: "t".into(),
            };
            ask(&core, |reply| Command::Register { req, reply }).unwrap();
            let (tx, out) = mpsc::unbounded_channel();
            let hello = Hello {
                node_id: "n".into(),
                free: slots(free),
                ..Default::default()
            };
            core.send(Command::Connect {
                node_id: "n".into(),
                conn: 1,
                hello,
                out: tx,
            })
            .unwrap();
            Harness {
                _dir: dir,
                core,
                join: Some(join),
                out,
            }
        }

        fn submit(&self, dataset: &str, max_attempts: u32) -> String {
            let sweep = format!(
                "name='t'\ndatasets=['{dataset}']\nmax_attempts={max_attempts}\n[[agents]]\nname='synthetic'\n"
            );
            let req = SubmitRunRequest {
                sweep_toml: sweep,
                ..Default::default()
            };
            ask(&self.core, |reply| Command::Submit { req, reply })
                .unwrap()
                .run_id
        }

        fn send(&self, body: node_message::Body) {
            self.core
                .send(Command::FromNode {
                    node_id: "n".into(),
                    conn: 1,
                    body,
                })
                .unwrap();
        }

        /// The next message of the wanted kind (skipping lease renewals).
        fn next(&mut self) -> coordinator_message::Body {
            loop {
                let m = self
                    .out
                    .blocking_recv()
                    .expect("core alive")
                    .unwrap()
                    .body
                    .unwrap();
                if !matches!(m, coordinator_message::Body::Renewal(_)) {
                    return m;
                }
            }
        }

        fn grant(&mut self) -> Grant {
            match self.next() {
                coordinator_message::Body::Grant(g) => g,
                other => panic!("expected a grant, got {other:?}"),
            }
        }

        fn ack(&mut self) -> ResultAck {
            match self.next() {
                coordinator_message::Body::ResultAck(a) => a,
                other => panic!("expected a result ack, got {other:?}"),
            }
        }

        fn summary(&self, run: &str) -> RunSummary {
            let list = ask(&self.core, |reply| Command::List { reply });
            list.runs.into_iter().find(|r| r.run_id == run).unwrap()
        }
    }

    impl Drop for Harness {
        fn drop(&mut self) {
            let _ = self.core.send(Command::Shutdown);
            if let Some(j) = self.join.take() {
                let _ = j.join();
            }
        }
    }

    fn outcome(success: bool, class: FailureClass) -> Outcome {
        Outcome {
            success,
            verdict: "v".into(),
            failure_class: class as i32,
            wall_s: 0.1,
            ..Default::default()
        }
    }

    fn result(attempt: Option<AttemptRef>, o: Outcome) -> node_message::Body {
        node_message::Body::Result(reprobench_proto::v1::AttemptResult {
            attempt,
            outcome: Some(o),
        })
    }

    #[test]
    fn idle_credit_is_used_by_work_submitted_later_and_results_are_idempotent() {
        let mut h = Harness::new(60_000);
        let run = h.submit("synthetic:2:1", 3);
        let g = h.grant();
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().accepted);
        // The same result again (a resend after a reconnect) is acknowledged, not recorded twice.
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().accepted);
        h.send(node_message::Body::Credit(Credit {
            kind: "synthetic".into(),
            slots: 1,
        }));
        let g2 = h.grant();
        assert_ne!(g2.attempt.unwrap().task_id, g.attempt.unwrap().task_id);
        h.send(result(g2.attempt, outcome(false, FailureClass::None)));
        assert!(h.ack().accepted);
        let s = h.summary(&run);
        assert_eq!(
            (s.state.as_str(), s.succeeded, s.failed),
            ("finished", 1, 1)
        );
        // A credit left over while idle is used by a run submitted later.
        h.send(node_message::Body::Credit(Credit {
            kind: "synthetic".into(),
            slots: 1,
        }));
        h.send(node_message::Body::Heartbeat(Heartbeat { running: vec![] }));
        let _ = h.summary(&run); // a round trip: the credit is in before the next submit
        let run2 = h.submit("synthetic:1:1", 3);
        let g3 = h.grant();
        assert_eq!(g3.run_id, run2);
    }

    #[test]
    fn infra_failures_retry_up_to_the_bound_then_error_and_stale_epochs_are_refused() {
        let mut h = Harness::new(60_000);
        let run = h.submit("synthetic:1:1", 2);
        let g1 = h.grant();
        h.send(result(g1.attempt, outcome(false, FailureClass::Infra)));
        assert!(h.ack().accepted);
        h.send(node_message::Body::Credit(Credit {
            kind: "synthetic".into(),
            slots: 1,
        }));
        let g2 = h.grant();
        assert_eq!(g2.attempt.unwrap().epoch, 2);
        assert_eq!(g2.attempt_number, 2);
        // A result for the first attempt is fenced off.
        h.send(result(g1.attempt, outcome(true, FailureClass::None)));
        let ack = h.ack();
        assert!(!ack.accepted && ack.reason.contains("stale"), "{ack:?}");
        h.send(result(g2.attempt, outcome(false, FailureClass::Infra)));
        assert!(h.ack().accepted);
        let s = h.summary(&run);
        assert_eq!((s.state.as_str(), s.errored), ("finished", 1), "{s:?}");
    }

    #[test]
    fn a_node_offering_several_kinds_gets_work_of_whichever_kind_has_some() {
        // Found on a real cluster: a pod offering sim and synthetic slots was never given
        // synthetic work when its credits listed sim first (a HashMap's order), and a run
        // stalled. Eleven kinds, work of one: listing order cannot hide it.
        let kinds: Vec<String> = (0..10).map(|i| format!("kind{i}")).collect();
        let mut offered: Vec<(&str, u32)> = kinds.iter().map(|k| (k.as_str(), 1)).collect();
        offered.push(("synthetic", 1));
        let mut h = Harness::with_slots(60_000, &offered, &offered);
        let run = h.submit("synthetic:2:1", 3);
        assert_eq!(h.summary(&run).running, 1, "one synthetic slot, one grant");
        let g = h.grant();
        assert_eq!(g.kind, "synthetic");
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().accepted);
        // Its synthetic credit comes back: the second task goes to it too.
        h.send(node_message::Body::Credit(Credit {
            kind: "synthetic".into(),
            slots: 1,
        }));
        let g2 = h.grant();
        assert_ne!(g2.attempt.unwrap().task_id, g.attempt.unwrap().task_id);
    }

    #[test]
    fn a_gone_node_s_leases_are_released_at_once_and_its_old_results_refused() {
        // A lease far longer than the test: only NodeGone can release it.
        let mut h = Harness::new(600_000);
        let run = h.submit("synthetic:2:1", 3);
        let g1 = h.grant();
        let counts = ask(&h.core, |reply| Command::Counts { reply });
        assert_eq!(
            counts,
            vec![KindCounts {
                kind: "synthetic".into(),
                pending: 1,
                running: 1
            }]
        );
        h.core
            .send(Command::NodeGone {
                node_id: "n".into(),
                reason: "node pod n was deleted".into(),
            })
            .unwrap();
        match h.next() {
            coordinator_message::Body::Revoke(r) => {
                assert_eq!(r.attempt, g1.attempt);
                assert!(r.reason.contains("node pod n was deleted"), "{}", r.reason);
            }
            other => panic!("expected a revoke, got {other:?}"),
        }
        let s = h.summary(&run);
        assert_eq!(
            (s.pending, s.running, s.retried_attempts),
            (2, 0, 1),
            "{s:?}"
        );
        let counts = ask(&h.core, |reply| Command::Counts { reply });
        assert_eq!((counts[0].pending, counts[0].running), (2, 0));
        // The released epoch's result, arriving late, is not recorded.
        h.send(result(g1.attempt, outcome(true, FailureClass::None)));
        assert!(!h.ack().accepted);
        // An unknown node is no error.
        h.core
            .send(Command::NodeGone {
                node_id: "never-seen".into(),
                reason: "x".into(),
            })
            .unwrap();
        assert_eq!(h.summary(&run).pending, 2);

        // The gone node, still connected for a moment, asks for more work: it gets none.
        h.send(node_message::Body::Credit(Credit {
            kind: "synthetic".into(),
            slots: 1,
        }));
        assert_eq!(h.summary(&run).pending, 2);
        while let Ok(m) = h.out.try_recv() {
            let body = m.unwrap().body.unwrap();
            assert!(
                !matches!(body, coordinator_message::Body::Grant(_)),
                "a gone node was granted work: {body:?}"
            );
        }
        // A new pod of the same name connects anew and is given work.
        let (tx, out) = mpsc::unbounded_channel();
        h.out = out;
        let hello = Hello {
            node_id: "n".into(),
            free: vec![SlotCount {
                kind: "synthetic".into(),
                slots: 1,
            }],
            ..Default::default()
        };
        h.core
            .send(Command::Connect {
                node_id: "n".into(),
                conn: 2,
                hello,
                out: tx,
            })
            .unwrap();
        let g = h.grant();
        assert_eq!(g.run_id, run);
    }

    #[test]
    fn an_expired_lease_is_revoked_and_requeued() {
        let mut h = Harness::new(200);
        let run = h.submit("synthetic:1:1", 3);
        let g1 = h.grant();
        // No heartbeat: the lease runs out, the node is told, and the task is pending again.
        match h.next() {
            coordinator_message::Body::Revoke(r) => {
                assert_eq!(r.attempt, g1.attempt);
                assert!(r.reason.contains("lease expired"), "{}", r.reason);
            }
            other => panic!("expected a revoke, got {other:?}"),
        }
        let s = h.summary(&run);
        assert_eq!(
            (s.pending, s.running, s.retried_attempts),
            (1, 0, 1),
            "{s:?}"
        );
    }
}
