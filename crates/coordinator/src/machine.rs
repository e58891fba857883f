//! The coordinator's state machine: every task, run, node and lease the core knows, and
//! [`Machine::step`], which takes one [`Input`] at a given [`Now`] and returns its [`Effects`]:
//! the store writes to make, then the messages and the answer to send once they are committed.
//!
//! Nothing here touches SQLite, a channel, a thread or the clock. The driver in
//! [`crate::core`] reads the clock, applies each step's writes inside one transaction, commits,
//! and only then sends. Tasks move only through the lifecycle table ([`crate::lifecycle`]), so
//! the invariants (one result per task, stale attempts fenced off, nothing announced that the
//! same step does not write) are tested here on plain values.

use crate::core::KindCounts;
use crate::credentials::Principal;
use crate::lifecycle::{self, Attempt, Ending, Event, ResultContext, ResultVerdict, TaskState};
use crate::scheduler::{NodeIdx, Policy, QueuedTask, Scheduler, TaskId};
use crate::store::{LoadedRun, LoadedTask, NewTask, ResultRecord};
use crate::sweep;
use reprobench_domain::messages::{
    CoordinatorMessage, Grant, Hello, NodeMessage, NodeProgress, Registered, Registration, RunList,
    RunProgress, RunState, RunSummary, SubmitRun, Submitted, Upcoming,
};
use reprobench_domain::outcome::{AttemptRef, FailureClass, Outcome};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::sweep::SweepSpec;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Lease and heartbeat timing, and the placement policy.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// A lease lasts this long after its last renewal.
    pub lease_ms: u64,
    /// Nodes heartbeat this often.
    pub heartbeat_ms: u64,
    /// Placement policy (the benchmark's baseline uses `StaticRoundRobin`).
    pub policy: Policy,
    /// The most tasks one sweep may expand to (`serve --max-sweep-tasks`).
    pub max_sweep_tasks: u64,
    /// The most messages that may wait for one node before it is disconnected
    /// (`serve --max-node-queue`; read by the driver, not the machine).
    pub max_node_queue: usize,
}

/// See [`CoreConfig::max_sweep_tasks`]: room for all of SWT-bench (2,294 instances) under four
/// agents, three variants, five backbones and five repeats (688,200 tasks), and more.
pub const DEFAULT_MAX_SWEEP_TASKS: u64 = 1_000_000;

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig {
            lease_ms: 15_000,
            heartbeat_ms: 3_000,
            policy: Policy::AffinityStealing,
            max_sweep_tasks: DEFAULT_MAX_SWEEP_TASKS,
            max_node_queue: crate::core::DEFAULT_MAX_NODE_QUEUE,
        }
    }
}

/// One Work stream of a node (the driver holds its sender; the machine only names it).
pub type ConnId = u64;

/// The time a step happens at, read by the driver: a monotonic instant for leases and
/// throttles, and wall-clock milliseconds for what the store records.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic time.
    pub at: Instant,
    /// Milliseconds since the Unix epoch.
    pub wall_ms: i64,
}

/// Something that happens to the coordinator: a request, a node's message, or time passing.
#[derive(Debug)]
pub enum Input {
    /// A node registers.
    Register(Registration),
    /// A node opened Work stream `conn` and said hello.
    Connect {
        /// The node.
        node_id: String,
        /// The stream.
        conn: ConnId,
        /// Its hello.
        hello: Hello,
    },
    /// A message on a Work stream.
    FromNode {
        /// The node.
        node_id: String,
        /// The stream it came on.
        conn: ConnId,
        /// The message.
        body: NodeMessage,
    },
    /// A Work stream ended.
    Disconnect {
        /// The node.
        node_id: String,
        /// The stream.
        conn: ConnId,
    },
    /// SubmitRun; `run_id` is the id a new run gets (the driver draws it, with its randomness).
    Submit {
        /// The request.
        req: SubmitRun,
        /// The id for a new run.
        run_id: String,
        /// The submitting credential's id.
        owner: String,
    },
    /// CancelRun.
    Cancel {
        /// The run.
        run_id: String,
        /// Who asks.
        caller: Principal,
    },
    /// ListRuns.
    List,
    /// WatchRun: someone starts watching this run.
    Watch {
        /// The run.
        run_id: String,
    },
    /// A node is gone for good: its attempts are released now.
    NodeGone {
        /// The node.
        node_id: String,
        /// Why (said in the revokes and the attempts' reasons).
        reason: String,
    },
    /// Pending and leased tasks per executor kind.
    Counts,
    /// Leases per connected node.
    NodeLoads,
    /// Time passed: silent nodes leave the schedule and expired leases are released.
    Tick,
    /// The end of a batch: pending work is granted to nodes with credit.
    Dispatch,
}

/// Why the machine, or its driver, refuses a request. The server answers it as the gRPC status
/// of the same name; neither the machine nor the driver knows the transport.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// It names a run the coordinator does not have.
    NotFound(String),
    /// It is malformed (a sweep that does not parse or expand).
    InvalidArgument(String),
    /// It cannot be done in the current state (another protocol version, a node id in use).
    FailedPrecondition(String),
    /// It would make a second of something that must be one.
    AlreadyExists(String),
    /// The caller may not do it.
    PermissionDenied(String),
    /// The coordinator cannot take it now: its core stopped or is stopping (the driver's).
    Unavailable(String),
    /// A limit was reached: a node let too many messages wait unread (the driver's).
    ResourceExhausted(String),
}

/// The refusal of a request that names a run the coordinator does not have.
pub fn no_such_run(run_id: &str) -> Refused {
    Refused::NotFound(format!(
        "no run `{run_id}`; `reprobench status` lists the runs"
    ))
}

/// The answer to the input's asker, sent after the commit.
#[derive(Debug)]
pub enum Answer {
    /// To [`Input::Register`].
    Register(Result<Registered, Refused>),
    /// To [`Input::Connect`]: an error closes the stream.
    Connect(Result<(), Refused>),
    /// To [`Input::Submit`].
    Submit(Result<Submitted, Refused>),
    /// To [`Input::Cancel`]: how many tasks were withdrawn.
    Cancel(Result<u64, Refused>),
    /// To [`Input::List`].
    List(RunList),
    /// To [`Input::Watch`]: an error ends the watch.
    Watch(Result<(), Refused>),
    /// To [`Input::Counts`].
    Counts(Vec<KindCounts>),
    /// To [`Input::NodeLoads`]: (node id, attempts it holds), every connected node.
    NodeLoads(Vec<(String, u64)>),
}

/// A store write a step asks for; the driver applies them in order, in the batch's transaction.
#[derive(Debug, Clone)]
pub enum Write {
    /// A node registered.
    UpsertNode {
        /// The node.
        node_id: String,
        /// Its host.
        hostname: String,
        /// Its slots as `kind=n,…`.
        slots: String,
        /// When.
        at_ms: i64,
    },
    /// A new run and its tasks, under the ids the machine gave them.
    InsertRun {
        /// The run.
        run: LoadedRun,
        /// Its sweep, as TOML.
        sweep_toml: String,
        /// Its attachments, as JSON.
        attachments_json: String,
        /// The task ids, in the order of `tasks`.
        ids: Vec<TaskId>,
        /// The tasks.
        tasks: Vec<NewTask>,
    },
    /// A run finished or was cancelled.
    SetRunState {
        /// The run.
        run_id: String,
        /// `finished` or `cancelled`.
        state: &'static str,
        /// When.
        finished_at_ms: Option<i64>,
    },
    /// A task was granted: its attempt `epoch` opens.
    RecordGrant {
        /// The task.
        task: TaskId,
        /// The attempt.
        epoch: u64,
        /// The node.
        node_id: String,
        /// When.
        at_ms: i64,
    },
    /// An attempt closed.
    EndAttempt {
        /// The task.
        task: TaskId,
        /// The attempt.
        epoch: u64,
        /// How it ended (`finished`, `infra_error`, `lease_expired`, …).
        status: &'static str,
        /// Why, if not plainly.
        reason: Option<String>,
        /// When.
        at_ms: i64,
    },
    /// A result for an old attempt arrived and was refused.
    MarkLateResult {
        /// The task.
        task: TaskId,
        /// The stale attempt.
        epoch: u64,
        /// When.
        at_ms: i64,
    },
    /// A task's state changed.
    SetTaskState {
        /// The task.
        task: TaskId,
        /// Its new state.
        state: TaskState,
        /// Its infrastructure failures so far.
        infra_failures: u32,
    },
    /// A task's one result row.
    InsertResult {
        /// The task.
        task: TaskId,
        /// Its run.
        run_id: String,
        /// The attempt that produced it.
        epoch: u64,
        /// The figures.
        record: ResultRecord,
    },
}

/// A message for a node's Work stream.
#[derive(Debug, Clone)]
pub struct ToNode {
    /// The stream.
    pub conn: ConnId,
    /// The message. A grant's `variant`, `instance_id` and `payload_json` are left empty here:
    /// the driver fills them from the store, which keeps the payloads out of memory.
    pub body: CoordinatorMessage,
}

/// What one step asks of the driver: write, commit, then send the messages and the answer.
#[derive(Debug, Default)]
pub struct Effects {
    /// Store writes, in order.
    pub writes: Vec<Write>,
    /// Messages to nodes, in order.
    pub messages: Vec<ToNode>,
    /// The answer to the input's asker, if it has one.
    pub answer: Option<Answer>,
}

struct TaskMem {
    run: Arc<str>,
    state: TaskState,
    epoch: u64,
    infra_failures: u32,
    kind: ExecutorKind,
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
    /// The submitting credential's id.
    owner: String,
    node_finished: HashMap<NodeIdx, u64>,
    dirty: bool,
    last_publish: Option<Instant>,
    /// Since this core started: when the first task of the run was granted, and how many have
    /// finished.
    session_start: Option<Instant>,
    session_done: u64,
    /// The run's pending tasks per executor kind.
    pending_by_kind: BTreeMap<ExecutorKind, u64>,
}

impl RunMem {
    /// Counts a task of `kind` leaving (`delta` -1) or entering (+1) the pending state.
    fn count_pending(&mut self, kind: ExecutorKind, delta: i64) {
        let n = self.pending_by_kind.entry(kind).or_insert(0);
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            self.pending_by_kind.remove(&kind);
        }
    }
}

/// The slots of `kind` a node registered (0 for a kind it did not register).
fn registered_slots(slots: &[(ExecutorKind, u32)], kind: ExecutorKind) -> u32 {
    slots
        .iter()
        .filter(|(k, _)| *k == kind)
        .map(|(_, n)| *n)
        .sum()
}

struct NodeMem {
    id: String,
    slots: Vec<(ExecutorKind, u32)>,
    conn: Option<ConnId>,
    last_seen: Instant,
    draining: bool,
    credits: HashMap<ExecutorKind, u32>,
    in_sched: bool,
    /// The registered process's session and host (a second process under this name is refused
    /// while this one is connected).
    session: String,
    hostname: String,
}

/// The coordinator's state: tasks, runs, nodes, leases and the scheduler, in memory.
pub struct Machine {
    cfg: CoreConfig,
    sched: Scheduler,
    tasks: HashMap<TaskId, TaskMem>,
    next_task_id: TaskId,
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
    /// The time of the step under way.
    now: Now,
    /// The effects of the step under way.
    fx: Effects,
}

impl Machine {
    /// The state the store held at start-up. Every lease held at the crash gets a fresh one
    /// (leases are not stored), so its node can reconnect and claim it before it is requeued.
    pub fn load(
        cfg: CoreConfig,
        runs: Vec<LoadedRun>,
        durations: Vec<(String, String, f64)>,
        tasks: Vec<LoadedTask>,
        now: Now,
    ) -> Machine {
        let mut m = Machine {
            sched: Scheduler::new(cfg.policy),
            cfg,
            tasks: HashMap::new(),
            next_task_id: 1,
            runs: HashMap::new(),
            run_order: Vec::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            leases: HashMap::new(),
            hungry: BTreeSet::new(),
            work_added: false,
            strings: HashSet::new(),
            now,
            fx: Effects::default(),
        };
        for run in &runs {
            m.add_run_mem(run);
        }
        for (key, agent, wall_s) in durations {
            m.sched.record_duration(&key, &agent, wall_s);
        }
        let grace = now.at + Duration::from_millis(m.cfg.lease_ms);
        let mut resumed = 0usize;
        for t in tasks {
            m.next_task_id = m.next_task_id.max(t.task_id + 1);
            let run = m.intern(&t.run_id);
            let st = TaskState::parse(&t.state);
            let Some(kind) = ExecutorKind::parse(&t.kind) else {
                // Only a newer build's store could hold one; its task waits for that build.
                tracing::error!(task = t.task_id, kind = %t.kind, "a stored task of an executor kind this build does not know is left alone");
                continue;
            };
            let node = t.node_id.as_deref().map(|n| m.node_idx(n));
            let mem = TaskMem {
                run: run.clone(),
                state: st,
                epoch: t.epoch,
                infra_failures: t.infra_failures,
                kind,
                key: m.intern(&t.affinity_key),
                agent: m.intern(&t.agent),
                node,
                result_epoch: None,
            };
            match st {
                TaskState::Pending => {
                    m.sched.enqueue(QueuedTask {
                        id: t.task_id,
                        kind: mem.kind,
                        key: &mem.key,
                        agent: &mem.agent,
                    });
                    resumed += 1;
                }
                TaskState::Leased => {
                    let node = node.expect("a leased task has a node");
                    m.leases.insert(
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
            if let Some(r) = m.runs.get_mut(&run) {
                bump(&mut r.summary, st, 1);
                if st == TaskState::Pending {
                    r.count_pending(mem.kind, 1);
                }
            }
            m.tasks.insert(t.task_id, mem);
        }
        if resumed > 0 {
            tracing::info!(tasks = resumed, "resuming unfinished work from the store");
        }
        m
    }

    /// Takes one input at `now`; returns what to write, then what to send.
    pub fn step(&mut self, input: Input, now: Now) -> Effects {
        self.now = now;
        match input {
            Input::Register(req) => {
                let answer = self.register(req);
                self.answer(Answer::Register(answer));
            }
            Input::Connect {
                node_id,
                conn,
                hello,
            } => {
                let answer = self.connect(node_id, conn, hello);
                self.answer(Answer::Connect(answer));
            }
            Input::FromNode {
                node_id,
                conn,
                body,
            } => self.on_node_message(&node_id, conn, body),
            Input::Disconnect { node_id, conn } => self.disconnect(&node_id, conn),
            Input::Submit { req, run_id, owner } => {
                let answer = self.submit(req, run_id, owner);
                self.answer(Answer::Submit(answer));
            }
            Input::Cancel { run_id, caller } => {
                let answer = self.cancel(&run_id, &caller);
                self.answer(Answer::Cancel(answer));
            }
            Input::List => {
                let runs = self
                    .run_order
                    .iter()
                    .map(|r| self.summary_now(&self.runs[r]))
                    .collect();
                let live_nodes = self.nodes.iter().filter(|n| n.in_sched).count() as u32;
                self.answer(Answer::List(RunList { runs, live_nodes }));
            }
            Input::Watch { run_id } => {
                let answer = match self.runs.get_mut(run_id.as_str()) {
                    Some(run) => {
                        run.dirty = true;
                        run.last_publish = None;
                        Ok(())
                    }
                    None => Err(no_such_run(&run_id)),
                };
                self.answer(Answer::Watch(answer));
            }
            Input::NodeGone { node_id, reason } => self.node_gone(&node_id, &reason),
            Input::Counts => {
                let counts = self.kind_counts();
                self.answer(Answer::Counts(counts));
            }
            Input::NodeLoads => {
                let loads = self.node_loads();
                self.answer(Answer::NodeLoads(loads));
            }
            Input::Tick => self.tick(),
            Input::Dispatch => self.dispatch(),
        }
        std::mem::take(&mut self.fx)
    }

    /// How often the driver should step [`Input::Tick`].
    pub fn tick_interval(&self) -> Duration {
        Duration::from_millis((self.cfg.lease_ms / 10).clamp(20, 100))
    }

    /// The progress of `run_id` for its watchers if there is news since the last time, at most
    /// every 100 ms while it runs; `true` beside it when the run is over (the watch ends).
    pub fn publish(&mut self, run_id: &str, now: Instant) -> Option<(RunProgress, bool)> {
        let r = self.runs.get(run_id)?;
        if !r.dirty {
            return None;
        }
        let done = r.summary.state != RunState::Running;
        if !done
            && r.last_publish
                .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return None;
        }
        let key = self.runs.get_key_value(run_id).expect("run").0.clone();
        let progress = self.progress(&key, now);
        let r = self.runs.get_mut(run_id).expect("run");
        r.dirty = false;
        r.last_publish = Some(now);
        Some((progress, done))
    }

    fn answer(&mut self, answer: Answer) {
        self.fx.answer = Some(answer);
    }

    fn write(&mut self, write: Write) {
        self.fx.writes.push(write);
    }

    fn send_to_node(&mut self, node: NodeIdx, body: CoordinatorMessage) {
        if let Some(conn) = self.nodes[node as usize].conn {
            self.fx.messages.push(ToNode { conn, body });
        }
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
            last_seen: self.now.at,
            draining: false,
            credits: HashMap::new(),
            in_sched: false,
            session: String::new(),
            hostname: String::new(),
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
                    state: RunState::parse(&run.state).unwrap_or_default(),
                    tasks: run.tasks,
                    created_at_ms: run.created_at_ms,
                    finished_at_ms: run.finished_at_ms.unwrap_or(0),
                    ..Default::default()
                },
                sweep_hash: run.sweep_hash.clone(),
                max_attempts: run.max_attempts,
                owner: run.owner.clone(),
                node_finished: HashMap::new(),
                dirty: true,
                last_publish: None,
                session_start: None,
                session_done: 0,
                pending_by_kind: BTreeMap::new(),
            },
        );
    }

    /// Leases each connected node holds, by node id.
    fn node_loads(&self) -> Vec<(String, u64)> {
        let mut held = vec![0u64; self.nodes.len()];
        for lease in self.leases.values() {
            held[lease.node as usize] += 1;
        }
        self.nodes
            .iter()
            .zip(held)
            .filter(|(node, _)| node.conn.is_some())
            .map(|(node, n)| (node.id.clone(), n))
            .collect()
    }

    fn kind_counts(&self) -> Vec<KindCounts> {
        // In the order of the kinds' names.
        let mut by_kind: std::collections::BTreeMap<&str, KindCounts> = Default::default();
        for t in self.tasks.values() {
            let (pending, running) = match t.state {
                TaskState::Pending => (1, 0),
                TaskState::Leased => (0, 1),
                _ => continue,
            };
            let c = by_kind
                .entry(t.kind.as_str())
                .or_insert_with(|| KindCounts {
                    kind: t.kind,
                    pending: 0,
                    running: 0,
                });
            c.pending += pending;
            c.running += running;
        }
        // Kinds the nodes offer appear even with nothing to do (a scaler reads zeros, not gaps).
        for node in &self.nodes {
            for (kind, _) in &node.slots {
                by_kind.entry(kind.as_str()).or_insert_with(|| KindCounts {
                    kind: *kind,
                    pending: 0,
                    running: 0,
                });
            }
        }
        by_kind.into_values().collect()
    }

    fn disconnect(&mut self, node_id: &str, conn: ConnId) {
        if let Some(&n) = self.node_index.get(node_id)
            && self.nodes[n as usize].conn == Some(conn)
        {
            tracing::info!(node = %node_id, "node disconnected; its leases run until they expire");
            self.nodes[n as usize].conn = None;
            self.nodes[n as usize].credits.clear();
            self.leave_sched(n);
        }
    }

    fn node_gone(&mut self, node_id: &str, reason: &str) {
        let Some(&n) = self.node_index.get(node_id) else {
            return;
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
            self.release_lease(task, n, epoch, "node_gone", why);
        }
    }

    /// Ends the attempt `epoch` of `task` that node `n` held (`status` in the store), tells the
    /// node in case it still listens, and retries the task or closes it at the bound.
    fn release_lease(
        &mut self,
        task: TaskId,
        n: NodeIdx,
        epoch: u64,
        status: &'static str,
        reason: String,
    ) {
        self.leases.remove(&task);
        let node_id = self.nodes[n as usize].id.clone();
        self.write(Write::EndAttempt {
            task,
            epoch,
            status,
            reason: Some(reason.clone()),
            at_ms: self.now.wall_ms,
        });
        let attempt = AttemptRef {
            task_id: task,
            epoch,
        };
        self.send_to_node(
            n,
            CoordinatorMessage::Revoke {
                attempt,
                reason: reason.clone(),
            },
        );
        self.infra_failure(task, status, reason, &node_id);
    }

    /// A node's registration (its protocol version was checked where it came in).
    fn register(&mut self, req: Registration) -> Result<Registered, Refused> {
        if req.node_id.trim().is_empty() {
            return Err(Refused::InvalidArgument(
                "node_id is empty; pass --name or let the node choose one".into(),
            ));
        }
        if req.slots.is_empty() {
            return Err(Refused::InvalidArgument(format!(
                "node `{}` offers no slots; pass --slots KIND=N",
                req.node_id
            )));
        }
        if let Some(&n) = self.node_index.get(&req.node_id) {
            self.refuse_a_twin(n, &req.session)?;
        }
        let slots: Vec<(ExecutorKind, u32)> = req.slots.iter().map(|s| (s.kind, s.slots)).collect();
        let slots_text = slots
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect::<Vec<_>>()
            .join(",");
        self.write(Write::UpsertNode {
            node_id: req.node_id.clone(),
            hostname: req.hostname.clone(),
            slots: slots_text.clone(),
            at_ms: self.now.wall_ms,
        });
        let n = self.node_idx(&req.node_id);
        self.nodes[n as usize].session = req.session.clone();
        self.nodes[n as usize].hostname = req.hostname.clone();
        if self.nodes[n as usize].slots != slots {
            self.leave_sched(n);
            self.nodes[n as usize].slots = slots;
        }
        tracing::info!(node = %req.node_id, host = %req.hostname, slots = %slots_text, "node registered");
        Ok(Registered {
            node_id: req.node_id,
            lease_ms: self.cfg.lease_ms,
            heartbeat_ms: self.cfg.heartbeat_ms,
        })
    }

    /// Refuses a process of another session under the name of node `n` while `n` is connected:
    /// two processes under one name would replace each other's stream and leases. (A Work stream
    /// must come with the session that registered last, so Register is where this is checked.)
    fn refuse_a_twin(&self, n: NodeIdx, session: &str) -> Result<(), Refused> {
        let node = &self.nodes[n as usize];
        if node.conn.is_some() && !session.is_empty() && node.session != session {
            return Err(Refused::AlreadyExists(format!(
                "a node named `{}` is already connected (host `{}`); give this node another --name, or stop that one first (a stopped node's name is free as soon as its stream closes)",
                node.id, node.hostname
            )));
        }
        Ok(())
    }

    fn connect(&mut self, node_id: String, conn: ConnId, hello: Hello) -> Result<(), Refused> {
        let Some(&n) = self
            .node_index
            .get(&node_id)
            .filter(|&&n| !self.nodes[n as usize].slots.is_empty())
        else {
            return Err(Refused::FailedPrecondition(format!(
                "node `{node_id}` opened a Work stream without registering; call Register first"
            )));
        };
        if !hello.session.is_empty() && self.nodes[n as usize].session != hello.session {
            return Err(Refused::FailedPrecondition(format!(
                "node `{node_id}` opened a Work stream under another session than it registered with; call Register first"
            )));
        }
        {
            let now = self.now.at;
            let node = &mut self.nodes[n as usize];
            node.conn = Some(conn);
            node.last_seen = now;
            node.draining = hello.draining;
            // Never more credit than the slots it registered: a node cannot ask for more work.
            node.credits = hello
                .free
                .iter()
                .map(|s| (s.kind, s.slots.min(registered_slots(&node.slots, s.kind))))
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
            self.write(Write::EndAttempt {
                task,
                epoch,
                status: "lost",
                reason: Some(reason),
                at_ms: self.now.wall_ms,
            });
            self.requeue(task, Event::AttemptLost { retry: true });
        }
        self.renew(n, &hello.running);
        if !hello.draining {
            self.join_sched(n);
        }
        tracing::info!(node = %node_id, running = hello.running.len(), "node connected");
        Ok(())
    }

    fn on_node_message(&mut self, node_id: &str, conn: ConnId, body: NodeMessage) {
        let Some(&n) = self.node_index.get(node_id) else {
            return;
        };
        if self.nodes[n as usize].conn != Some(conn) {
            return; // a superseded stream
        }
        self.nodes[n as usize].last_seen = self.now.at;
        if !self.nodes[n as usize].in_sched && !self.nodes[n as usize].draining {
            self.join_sched(n);
        }
        match body {
            NodeMessage::Hello(_) => {}
            NodeMessage::Heartbeat { running } => self.renew(n, &running),
            NodeMessage::Credit(c) => {
                let node = &mut self.nodes[n as usize];
                if !node.draining {
                    let cap = registered_slots(&node.slots, c.kind);
                    let credit = node.credits.entry(c.kind).or_insert(0);
                    *credit = credit.saturating_add(c.slots).min(cap);
                    self.hungry.insert(n);
                }
            }
            NodeMessage::Progress { .. } => {}
            NodeMessage::Result { attempt, outcome } => self.result(n, attempt, outcome),
            NodeMessage::HandBack { attempt: a, reason } => {
                if self
                    .leases
                    .get(&a.task_id)
                    .is_some_and(|l| l.node == n && l.epoch == a.epoch)
                {
                    self.leases.remove(&a.task_id);
                    let reason = format!("handed back by {node_id}: {reason}");
                    self.write(Write::EndAttempt {
                        task: a.task_id,
                        epoch: a.epoch,
                        status: "handed_back",
                        reason: Some(reason),
                        at_ms: self.now.wall_ms,
                    });
                    self.requeue(a.task_id, Event::AttemptLost { retry: true });
                }
            }
            NodeMessage::Draining => {
                tracing::info!(node = %node_id, "node is draining");
                self.nodes[n as usize].draining = true;
                self.nodes[n as usize].credits.clear();
                self.leave_sched(n);
                // The node may stop once it has this: the grants sent before it came first.
                self.send_to_node(n, CoordinatorMessage::DrainingAck);
            }
        }
    }

    /// Extends the leases a node reports; revokes what it runs without a lease.
    fn renew(&mut self, n: NodeIdx, running: &[AttemptRef]) {
        let deadline = self.now.at + Duration::from_millis(self.cfg.lease_ms);
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
                        CoordinatorMessage::Revoke {
                            attempt: *a,
                            reason,
                        },
                    );
                }
            }
        }
        let lease_ms = self.cfg.lease_ms;
        self.send_to_node(n, CoordinatorMessage::Renewal { renewed, lease_ms });
    }

    fn join_sched(&mut self, n: NodeIdx) {
        let node = &mut self.nodes[n as usize];
        if node.in_sched || node.slots.is_empty() || node.conn.is_none() {
            return;
        }
        node.in_sched = true;
        let kinds: Vec<ExecutorKind> = node.slots.iter().map(|(k, _)| *k).collect();
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
        req: SubmitRun,
        run_id: String,
        owner: String,
    ) -> Result<Submitted, Refused> {
        let spec = SweepSpec::from_toml(&req.sweep_toml)
            .map_err(|e| Refused::InvalidArgument(e.to_string()))?;
        let attachments: sweep::Attachments = req.attachments.into_iter().collect();
        let hash = sweep::sweep_hash(&spec, &attachments);
        if req.resume_existing {
            let existing = self.run_order.iter().rev().find(|r| {
                let run = &self.runs[*r];
                run.sweep_hash == hash
                    && (run.summary.state == RunState::Running
                        || req.reuse_finished && run.summary.state == RunState::Finished)
            });
            if let Some(r) = existing {
                return Ok(Submitted {
                    run_id: r.to_string(),
                    tasks: self.runs[r].summary.tasks,
                    resumed: true,
                });
            }
        }
        let tasks: Vec<NewTask> = sweep::expand(&spec, &attachments, self.cfg.max_sweep_tasks)
            .map_err(|e| Refused::InvalidArgument(e.to_string()))?;
        let run = LoadedRun {
            run_id,
            name: spec.name.clone(),
            sweep_hash: hash,
            state: RunState::Running.as_str().into(),
            tasks: tasks.len() as u64,
            max_attempts: spec.max_attempts,
            created_at_ms: self.now.wall_ms,
            finished_at_ms: None,
            owner,
        };
        let attachments_json =
            serde_json::to_string(&attachments).expect("a string map serializes");
        let first = self.next_task_id;
        let ids: Vec<TaskId> = (first..first + tasks.len() as u64).collect();
        self.next_task_id += tasks.len() as u64;
        self.add_run_mem(&run);
        let run_key = self.intern(&run.run_id);
        let mut pending_by_kind: BTreeMap<ExecutorKind, u64> = BTreeMap::new();
        for (id, t) in ids.iter().zip(&tasks) {
            let mem = TaskMem {
                run: run_key.clone(),
                state: TaskState::Pending,
                epoch: 0,
                infra_failures: 0,
                kind: t.kind,
                key: self.intern(&t.affinity_key),
                agent: self.intern(&t.agent),
                node: None,
                result_epoch: None,
            };
            self.sched.enqueue(QueuedTask {
                id: *id,
                kind: mem.kind,
                key: &mem.key,
                agent: &mem.agent,
            });
            *pending_by_kind.entry(mem.kind).or_insert(0) += 1;
            self.tasks.insert(*id, mem);
        }
        self.work_added = true;
        let count = tasks.len() as u64;
        tracing::info!(run = %run.run_id, tasks = count, sweep = %spec.name, "run submitted");
        let response = Submitted {
            run_id: run.run_id.clone(),
            tasks: count,
            resumed: false,
        };
        self.write(Write::InsertRun {
            run,
            sweep_toml: spec.to_toml(),
            attachments_json,
            ids,
            tasks,
        });
        let r = self.runs.get_mut(&run_key).expect("just added");
        r.summary.pending = count;
        r.pending_by_kind = pending_by_kind;
        if count == 0 {
            self.check_finished(&run_key);
        }
        Ok(response)
    }

    fn cancel(&mut self, run_id: &str, caller: &Principal) -> Result<u64, Refused> {
        let Some(run_key) = self.runs.get_key_value(run_id).map(|(k, _)| k.clone()) else {
            return Err(no_such_run(run_id));
        };
        if let Some(refusal) = caller.cancel_refusal(&self.runs[&run_key].owner) {
            return Err(Refused::PermissionDenied(format!(
                "run `{run_id}`: {refusal}"
            )));
        }
        let ids: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, t)| {
                t.run == run_key && matches!(t.state, TaskState::Pending | TaskState::Leased)
            })
            .map(|(id, _)| *id)
            .collect();
        let now = self.now.wall_ms;
        for &id in &ids {
            let (st, epoch, node) = {
                let t = &self.tasks[&id];
                (t.state, t.epoch, t.node)
            };
            if st == TaskState::Pending {
                self.sched.remove(id);
            } else if let (Some(n), Some(_)) = (node, self.leases.remove(&id)) {
                self.write(Write::EndAttempt {
                    task: id,
                    epoch,
                    status: "cancelled",
                    reason: Some("run cancelled".into()),
                    at_ms: now,
                });
                let attempt = AttemptRef { task_id: id, epoch };
                self.send_to_node(
                    n,
                    CoordinatorMessage::Cancel {
                        attempt,
                        reason: "run cancelled".into(),
                    },
                );
            }
            let infra_failures = self.tasks[&id].infra_failures;
            if let Some(state) = self.advance(id, Event::Cancel) {
                self.write(Write::SetTaskState {
                    task: id,
                    state,
                    infra_failures,
                });
            }
        }
        let run = self.runs.get_mut(&run_key).expect("exists");
        if run.summary.state == RunState::Running {
            run.summary.state = RunState::Cancelled;
            run.summary.finished_at_ms = now;
            run.dirty = true;
            self.write(Write::SetRunState {
                run_id: run_id.to_string(),
                state: "cancelled",
                finished_at_ms: Some(now),
            });
        }
        Ok(ids.len() as u64)
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
        if old == TaskState::Pending && new != TaskState::Pending {
            run.count_pending(t.kind, -1);
        } else if new == TaskState::Pending && old != TaskState::Pending {
            run.count_pending(t.kind, 1);
        }
        run.dirty = true;
        Some(new)
    }

    /// Puts a task whose attempt was lost back in the queue, by `event` (a retrying
    /// [`Event::AttemptLost`]).
    fn requeue(&mut self, task: TaskId, event: Event) {
        let Some(state) = self.advance(task, event) else {
            return;
        };
        self.work_added = true;
        let t = self.tasks.get_mut(&task).expect("known task");
        t.node = None;
        let infra_failures = t.infra_failures;
        self.sched.enqueue(QueuedTask {
            id: task,
            kind: t.kind,
            key: &t.key,
            agent: &t.agent,
        });
        self.runs
            .get_mut(&t.run)
            .expect("run")
            .summary
            .retried_attempts += 1;
        self.write(Write::SetTaskState {
            task,
            state,
            infra_failures,
        });
    }

    /// An attempt failed for infrastructure reasons: retry it, or close the task when the bound is hit.
    fn infra_failure(&mut self, task: TaskId, class: &str, message: String, node: &str) {
        let t = self.tasks.get_mut(&task).expect("known task");
        t.infra_failures += 1;
        let max = self.runs[&t.run].max_attempts;
        let event = lifecycle::attempt_lost(t.infra_failures, max);
        if event == (Event::AttemptLost { retry: true }) {
            return self.requeue(task, event);
        }
        let now = self.now.wall_ms;
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
        self.finish(task, event, record);
    }

    /// Ends a task by `event` with its one result row.
    fn finish(&mut self, task: TaskId, event: Event, record: ResultRecord) {
        let Some(state) = self.advance(task, event) else {
            return;
        };
        let t = self.tasks.get_mut(&task).expect("known task");
        t.result_epoch = Some(t.epoch);
        let (run, epoch, infra_failures, node) = (t.run.clone(), t.epoch, t.infra_failures, t.node);
        self.write(Write::InsertResult {
            task,
            run_id: run.to_string(),
            epoch,
            record,
        });
        self.write(Write::SetTaskState {
            task,
            state,
            infra_failures,
        });
        let r = self.runs.get_mut(&run).expect("run");
        if let Some(n) = node {
            *r.node_finished.entry(n).or_insert(0) += 1;
        }
        r.session_done += 1;
        self.check_finished(&run);
    }

    fn check_finished(&mut self, run: &Arc<str>) {
        let now = self.now.wall_ms;
        let r = self.runs.get_mut(run).expect("run");
        if r.summary.state == RunState::Running && r.summary.pending == 0 && r.summary.running == 0
        {
            r.summary.state = RunState::Finished;
            r.summary.finished_at_ms = now;
            r.dirty = true;
            tracing::info!(run = %run, succeeded = r.summary.succeeded, failed = r.summary.failed, errored = r.summary.errored, "run finished");
            self.write(Write::SetRunState {
                run_id: run.to_string(),
                state: "finished",
                finished_at_ms: Some(now),
            });
        }
    }

    fn result(&mut self, n: NodeIdx, a: AttemptRef, outcome: Outcome) {
        let node_id = self.nodes[n as usize].id.clone();
        let ack = |accepted: bool, reason: String| CoordinatorMessage::ResultAck {
            attempt: a,
            accepted,
            reason,
        };
        let Some(t) = self.tasks.get(&a.task_id) else {
            self.send_to_node(n, ack(false, "unknown task".into()));
            return;
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
                return;
            }
            ResultVerdict::Refuse(reason) => {
                tracing::warn!(task = a.task_id, epoch = a.epoch, node = %node_id, %reason, "late result rejected");
                self.write(Write::MarkLateResult {
                    task: a.task_id,
                    epoch: a.epoch,
                    at_ms: self.now.wall_ms,
                });
                self.send_to_node(n, ack(false, reason));
                return;
            }
        }
        let granted_ms = self.leases.remove(&a.task_id).and_then(|l| l.granted_ms);
        let now = self.now.wall_ms;
        let mut outcome = outcome;
        // Executors that fail early (a bad payload, a sandbox error) send no times of their own.
        if outcome.started_at_ms == 0 {
            outcome.started_at_ms = granted_ms.unwrap_or(now);
        }
        if outcome.finished_at_ms == 0 {
            outcome.finished_at_ms = now;
        }
        let class = outcome.failure_class;
        if class == FailureClass::Infra {
            let message = if outcome.error_message.is_empty() {
                "infrastructure error".into()
            } else {
                outcome.error_message.clone()
            };
            self.write(Write::EndAttempt {
                task: a.task_id,
                epoch: a.epoch,
                status: "infra_error",
                reason: Some(message.clone()),
                at_ms: now,
            });
            let cls = if outcome.error_class.is_empty() {
                "executor".to_string()
            } else {
                outcome.error_class.clone()
            };
            self.infra_failure(a.task_id, &cls, message, &node_id);
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
            self.write(Write::EndAttempt {
                task: a.task_id,
                epoch: a.epoch,
                status: "finished",
                reason,
                at_ms: now,
            });
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
            self.finish(a.task_id, Event::Finished(ending), record);
        }
        self.send_to_node(n, ack(true, String::new()));
    }

    fn tick(&mut self) {
        let now = self.now.at;
        let silence = Duration::from_millis(self.cfg.lease_ms);
        for n in 0..self.nodes.len() as NodeIdx {
            let node = &self.nodes[n as usize];
            if node.in_sched && now.duration_since(node.last_seen) > silence {
                tracing::warn!(node = %node.id, "node silent for a lease period; no more grants until it speaks");
                self.leave_sched(n);
            }
        }
        let mut expired: Vec<(TaskId, NodeIdx, u64)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(t, l)| (*t, l.node, l.epoch))
            .collect();
        expired.sort_unstable();
        for (task, n, epoch) in expired {
            let node_id = &self.nodes[n as usize].id;
            let reason = format!(
                "lease expired: no heartbeat from {node_id} for {} ms",
                self.cfg.lease_ms
            );
            tracing::warn!(task, epoch, node = %node_id, "lease expired; requeueing");
            self.release_lease(task, n, epoch, "lease_expired", reason);
        }
    }

    /// Grants pending work to nodes that asked for it, one task per node per round.
    fn dispatch(&mut self) {
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
                let mut kinds: Vec<ExecutorKind> = node
                    .credits
                    .iter()
                    .filter(|(_, c)| **c > 0)
                    .map(|(k, _)| *k)
                    .collect();
                kinds.sort_by_key(|k| k.as_str());
                if kinds.is_empty() || !node.in_sched {
                    self.hungry.remove(&n);
                    continue;
                }
                let picked = kinds
                    .into_iter()
                    .find_map(|kind| self.sched.next_for(n, kind).map(|pick| (kind, pick)));
                match picked {
                    Some((kind, pick)) => {
                        let credit = self.nodes[n as usize]
                            .credits
                            .get_mut(&kind)
                            .expect("credit");
                        *credit -= 1;
                        // Full now: what it will most likely run next, so it can prepare it.
                        let upcoming = if *credit == 0 {
                            self.sched.peek_for(n, kind)
                        } else {
                            None
                        };
                        self.grant(n, pick.task, upcoming);
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
    }

    /// Grants `task` to node `n`, with `upcoming` as the hint of its next task.
    fn grant(&mut self, n: NodeIdx, task: TaskId, upcoming: Option<TaskId>) {
        if self.advance(task, Event::Grant).is_none() {
            return;
        }
        let t = self.tasks.get_mut(&task).expect("known task");
        t.epoch += 1;
        t.node = Some(n);
        let (epoch, run, kind, key, agent) = (
            t.epoch,
            t.run.clone(),
            t.kind,
            t.key.clone(),
            t.agent.clone(),
        );
        let node_id = self.nodes[n as usize].id.clone();
        let Now { at, wall_ms } = self.now;
        self.write(Write::RecordGrant {
            task,
            epoch,
            node_id,
            at_ms: wall_ms,
        });
        let r = self.runs.get_mut(&run).expect("run");
        r.session_start.get_or_insert(at);
        self.leases.insert(
            task,
            Lease {
                node: n,
                epoch,
                deadline: at + Duration::from_millis(self.cfg.lease_ms),
                granted_ms: Some(wall_ms),
            },
        );
        // The driver fills the variant, the instance and the payload from the store.
        let grant = Grant {
            attempt: AttemptRef {
                task_id: task,
                epoch,
            },
            run_id: run.to_string(),
            kind,
            affinity_key: key.to_string(),
            agent: agent.to_string(),
            variant: String::new(),
            instance_id: String::new(),
            payload_json: String::new(),
            lease_ms: self.cfg.lease_ms,
            attempt_number: epoch as u32,
            upcoming: upcoming.map(|task_id| Upcoming {
                task_id,
                payload_json: String::new(),
            }),
        };
        self.send_to_node(n, CoordinatorMessage::Grant(grant));
    }

    fn progress(&self, id: &Arc<str>, now: Instant) -> RunProgress {
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
        let s = self.summary_now(r);
        let remaining = s.pending + s.running;
        let eta_s = match r.session_start {
            Some(start) if r.session_done > 0 => Some(
                now.duration_since(start).as_secs_f64() / r.session_done as f64 * remaining as f64,
            ),
            _ if remaining == 0 => Some(0.0),
            _ => None,
        };
        RunProgress {
            run: s,
            nodes,
            eta_s,
        }
    }

    /// A run's summary with what only the live machine knows: the kinds its pending tasks need
    /// that no connected node offers.
    fn summary_now(&self, r: &RunMem) -> RunSummary {
        let mut s = r.summary.clone();
        s.unserved_kinds = r
            .pending_by_kind
            .keys()
            .copied()
            .filter(|&kind| {
                !self
                    .nodes
                    .iter()
                    .any(|n| n.in_sched && registered_slots(&n.slots, kind) > 0)
            })
            .collect();
        s
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

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_domain::messages::SlotCount;

    /// A start time and the times after it; nothing here reads the clock again.
    fn start() -> Now {
        Now {
            at: Instant::now(),
            wall_ms: 1_000_000,
        }
    }

    fn after(t: Now, ms: u64) -> Now {
        Now {
            at: t.at + Duration::from_millis(ms),
            wall_ms: t.wall_ms + ms as i64,
        }
    }

    fn slots(kind: ExecutorKind, n: u32) -> Vec<SlotCount> {
        vec![SlotCount { kind, slots: n }]
    }

    /// A machine with node `n` registered and connected on stream 1 with `free` synthetic slots.
    fn machine_with_node(lease_ms: u64, free: u32, t: Now) -> Machine {
        let cfg = CoreConfig {
            lease_ms,
            heartbeat_ms: lease_ms / 4,
            ..CoreConfig::default()
        };
        let mut m = Machine::load(cfg, vec![], vec![], vec![], t);
        let req = Registration {
            node_id: "n".into(),
            hostname: "h".into(),
            slots: slots(ExecutorKind::Synthetic, 4),
            binary_version: "t".into(),
            session: String::new(),
        };
        let fx = m.step(Input::Register(req), t);
        assert!(matches!(fx.answer, Some(Answer::Register(Ok(_)))));
        let hello = Hello {
            node_id: "n".into(),
            free: slots(ExecutorKind::Synthetic, free),
            ..Default::default()
        };
        let fx = m.step(
            Input::Connect {
                node_id: "n".into(),
                conn: 1,
                hello,
            },
            t,
        );
        assert!(matches!(fx.answer, Some(Answer::Connect(Ok(())))));
        m
    }

    fn submit(m: &mut Machine, dataset: &str, max_attempts: u32, t: Now) -> (String, Effects) {
        let sweep = format!(
            "name='t'\ndatasets=['{dataset}']\nmax_attempts={max_attempts}\n[[agents]]\nname='synthetic'\n"
        );
        let req = SubmitRun {
            sweep_toml: sweep,
            ..Default::default()
        };
        let run_id = format!("run-{}", m.run_order.len() + 1);
        let fx = m.step(
            Input::Submit {
                req,
                run_id,
                owner: "client-1".into(),
            },
            t,
        );
        match &fx.answer {
            Some(Answer::Submit(Ok(r))) => (r.run_id.clone(), fx),
            other => panic!("submit refused: {other:?}"),
        }
    }

    fn from_node(body: NodeMessage) -> Input {
        Input::FromNode {
            node_id: "n".into(),
            conn: 1,
            body,
        }
    }

    fn credit() -> Input {
        from_node(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }))
    }

    fn result(attempt: AttemptRef, success: bool, class: FailureClass) -> Input {
        from_node(NodeMessage::Result {
            attempt,
            outcome: Outcome {
                success,
                verdict: "v".into(),
                failure_class: class,
                wall_s: 0.1,
                ..Default::default()
            },
        })
    }

    fn grants(fx: &Effects) -> Vec<AttemptRef> {
        fx.messages
            .iter()
            .filter_map(|m| match &m.body {
                CoordinatorMessage::Grant(g) => Some(g.attempt),
                _ => None,
            })
            .collect()
    }

    /// A result's acknowledgement as a node reads it.
    #[derive(Debug)]
    struct Ack {
        accepted: bool,
        reason: String,
    }

    fn acks(fx: &Effects) -> Vec<Ack> {
        fx.messages
            .iter()
            .filter_map(|m| match &m.body {
                CoordinatorMessage::ResultAck {
                    accepted, reason, ..
                } => Some(Ack {
                    accepted: *accepted,
                    reason: reason.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    fn results_written(fx: &Effects) -> Vec<(TaskId, u64, ResultRecord)> {
        fx.writes
            .iter()
            .filter_map(|w| match w {
                Write::InsertResult {
                    task,
                    epoch,
                    record,
                    ..
                } => Some((*task, *epoch, record.clone())),
                _ => None,
            })
            .collect()
    }

    fn summary(m: &mut Machine, run: &str, t: Now) -> RunSummary {
        match m.step(Input::List, t).answer {
            Some(Answer::List(list)) => list.runs.into_iter().find(|r| r.run_id == run).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// Each grant's upcoming task, as the node reads it.
    fn upcoming(fx: &Effects) -> Vec<Option<TaskId>> {
        fx.messages
            .iter()
            .filter_map(|m| match &m.body {
                CoordinatorMessage::Grant(g) => Some(g.upcoming.as_ref().map(|u| u.task_id)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_grant_that_fills_the_node_names_the_task_it_gets_next() {
        let t = start();
        // Two free slots, four tasks: the first grant leaves a slot free (no hint), the second
        // fills the node and names the task the next freed slot is then granted.
        let mut m = machine_with_node(60_000, 2, t);
        submit(&mut m, "synthetic:4:1", 3, t);
        let fx = m.step(Input::Dispatch, t);
        let (first, hinted) = (grants(&fx), upcoming(&fx));
        assert_eq!(first.len(), 2);
        assert_eq!(hinted[0], None, "a slot was left free");
        let mut next = hinted[1].expect("the grant that filled the node names its next task");
        assert!(first.iter().all(|a| a.task_id != next));
        // Each freed slot is granted the task named last; the last task names none after it.
        let mut running = first[0];
        for (i, hint_left) in [true, false].into_iter().enumerate() {
            let at = after(t, 10 * (i as u64 + 1));
            let fx = m.step(result(running, true, FailureClass::None), at);
            assert!(acks(&fx).iter().all(|a| a.accepted));
            m.step(credit(), at);
            let fx = m.step(Input::Dispatch, at);
            let granted = grants(&fx);
            assert_eq!(
                granted.iter().map(|a| a.task_id).collect::<Vec<_>>(),
                vec![next],
                "the hint named the task granted next"
            );
            let hint = upcoming(&fx)[0];
            assert_eq!(hint.is_some(), hint_left, "{hint:?}");
            running = granted[0];
            next = hint.unwrap_or_default();
        }
    }

    #[test]
    fn a_run_names_the_kinds_of_its_pending_tasks_that_no_connected_node_offers() {
        let t = start();
        // The node offers synthetic slots but no credit yet: the tasks stay pending.
        let mut m = machine_with_node(60_000, 0, t);
        let (run, _) = submit(&mut m, "synthetic:2:1", 3, t);
        assert!(summary(&mut m, &run, t).unserved_kinds.is_empty());
        m.step(
            Input::Disconnect {
                node_id: "n".into(),
                conn: 1,
            },
            t,
        );
        let s = summary(&mut m, &run, t);
        assert_eq!(
            (s.pending, s.unserved_kinds),
            (2, vec![ExecutorKind::Synthetic])
        );
        let cancelled = m.step(
            Input::Cancel {
                run_id: run.clone(),
                caller: Principal {
                    id: "client-1".into(),
                    role: crate::credentials::Role::Client,
                    node: None,
                    node_prefix: None,
                },
            },
            t,
        );
        assert!(matches!(cancelled.answer, Some(Answer::Cancel(Ok(2)))));
        assert!(
            summary(&mut m, &run, t).unserved_kinds.is_empty(),
            "no pending task is left to wait"
        );
        // A later run, submitted while no node is connected, waits from the start.
        let (run2, _) = submit(&mut m, "synthetic:1:1", 3, t);
        assert_eq!(
            summary(&mut m, &run2, t).unserved_kinds,
            vec![ExecutorKind::Synthetic]
        );
    }

    #[test]
    fn a_result_is_written_once_and_its_redelivery_is_only_acknowledged() {
        let t = start();
        let mut m = machine_with_node(60_000, 1, t);
        let (run, fx) = submit(&mut m, "synthetic:1:1", 3, t);
        assert!(
            matches!(&fx.writes[..], [Write::InsertRun { ids, .. }] if ids.len() == 1),
            "{:?}",
            fx.writes
        );
        assert!(fx.messages.is_empty(), "no grant before the dispatch");
        let granted = grants(&m.step(Input::Dispatch, t));
        let [a] = granted[..] else {
            panic!("{granted:?}")
        };
        assert_eq!(a.epoch, 1);

        let fx = m.step(result(a, true, FailureClass::None), after(t, 5));
        let written = results_written(&fx);
        assert_eq!(written.len(), 1);
        assert_eq!((written[0].0, written[0].1), (a.task_id, 1));
        assert!(written[0].2.success);
        assert!(fx.writes.iter().any(|w| matches!(
            w,
            Write::SetRunState {
                state: "finished",
                ..
            }
        )));
        assert!(acks(&fx)[0].accepted);

        // A resend after a reconnect: acknowledged, nothing written.
        let fx = m.step(result(a, true, FailureClass::None), after(t, 6));
        assert!(fx.writes.is_empty(), "{:?}", fx.writes);
        let ack = &acks(&fx)[0];
        assert!(ack.accepted && ack.reason == "already recorded", "{ack:?}");
        let s = summary(&mut m, &run, t);
        assert_eq!((s.state, s.succeeded), (RunState::Finished, 1));
    }

    #[test]
    fn a_node_gets_no_more_credit_than_the_slots_it_registered() {
        let t = start();
        // Registered with 4 slots, it claims 50 free in its Hello and sends 100 more credits.
        let mut m = machine_with_node(60_000, 50, t);
        for _ in 0..100 {
            m.step(credit(), t);
        }
        submit(&mut m, "synthetic:20:1", 3, t);
        let granted = grants(&m.step(Input::Dispatch, t));
        assert_eq!(granted.len(), 4, "{granted:?}");
        // Credits of a kind it never registered give it nothing.
        m.step(
            from_node(NodeMessage::Credit(SlotCount {
                kind: ExecutorKind::Docker,
                slots: 10,
            })),
            t,
        );
        assert!(grants(&m.step(Input::Dispatch, t)).is_empty());
    }

    #[test]
    fn an_expired_lease_is_fenced_off_by_the_input_s_time_alone() {
        let t = start();
        let mut m = machine_with_node(1_000, 1, t);
        let (run, _) = submit(&mut m, "synthetic:1:1", 3, t);
        let [first] = grants(&m.step(Input::Dispatch, t))[..] else {
            panic!()
        };
        // One millisecond before the deadline nothing happens; at the deadline the lease ends.
        assert!(m.step(Input::Tick, after(t, 999)).writes.is_empty());
        let fx = m.step(Input::Tick, after(t, 1_000));
        assert!(
            fx.writes.iter().any(|w| matches!(w,
                Write::EndAttempt { task, epoch: 1, status: "lease_expired", .. } if *task == first.task_id)),
            "{:?}",
            fx.writes
        );
        assert!(fx.writes.iter().any(|w| matches!(
            w,
            Write::SetTaskState {
                state: TaskState::Pending,
                ..
            }
        )));
        assert!(fx.messages.iter().any(
            |m| matches!(&m.body, CoordinatorMessage::Revoke { attempt, .. } if *attempt == first)
        ));
        let s = summary(&mut m, &run, t);
        assert_eq!((s.pending, s.running, s.retried_attempts), (1, 0, 1));

        // The node speaks again and asks for work: the task comes back under epoch 2.
        let t2 = after(t, 1_001);
        m.step(from_node(NodeMessage::Heartbeat { running: vec![] }), t2);
        m.step(credit(), t2);
        let [second] = grants(&m.step(Input::Dispatch, t2))[..] else {
            panic!()
        };
        assert_eq!((second.task_id, second.epoch), (first.task_id, 2));

        // The first attempt's result, arriving late, is refused and only noted.
        let fx = m.step(result(first, true, FailureClass::None), t2);
        assert!(
            matches!(&fx.writes[..], [Write::MarkLateResult { epoch: 1, .. }]),
            "{:?}",
            fx.writes
        );
        assert!(!acks(&fx)[0].accepted);
        let fx = m.step(result(second, false, FailureClass::None), t2);
        assert_eq!(results_written(&fx).len(), 1);
        assert_eq!(results_written(&fx)[0].1, 2);
    }

    #[test]
    fn infra_failures_retry_up_to_the_bound_then_write_one_error_row() {
        let t = start();
        let mut m = machine_with_node(60_000, 1, t);
        let (run, _) = submit(&mut m, "synthetic:1:1", 2, t);
        let [a1] = grants(&m.step(Input::Dispatch, t))[..] else {
            panic!()
        };
        let fx = m.step(result(a1, false, FailureClass::Infra), t);
        assert!(results_written(&fx).is_empty(), "a retry writes no result");
        assert!(acks(&fx)[0].accepted);
        m.step(credit(), t);
        let [a2] = grants(&m.step(Input::Dispatch, t))[..] else {
            panic!()
        };
        assert_eq!(a2.epoch, 2);
        let fx = m.step(result(a2, false, FailureClass::Infra), t);
        let written = results_written(&fx);
        assert_eq!(written.len(), 1);
        let record = &written[0].2;
        assert_eq!(record.verdict, "error");
        assert_eq!(record.error_class.as_deref(), Some("infra:executor"));
        assert!(
            record
                .error_message
                .as_deref()
                .is_some_and(|m| m.starts_with("gave up after 2 attempts")),
            "{record:?}"
        );
        let s = summary(&mut m, &run, t);
        assert_eq!((s.state, s.errored), (RunState::Finished, 1));
    }

    /// The driver sends only after committing a step's writes; so what a message or an answer
    /// announces must be among the writes of the same step. Checked over a busy scenario.
    #[test]
    fn nothing_is_announced_that_its_own_step_does_not_write() {
        let t = start();
        let mut m = machine_with_node(1_000, 2, t);
        let mut steps: Vec<Effects> = Vec::new();
        let (_, fx) = submit(&mut m, "synthetic:4:1", 2, t);
        steps.push(fx);
        let mut clock = t;
        for round in 0..12u64 {
            clock = after(clock, 400);
            let fx = m.step(Input::Dispatch, clock);
            let granted = grants(&fx);
            steps.push(fx);
            for (i, a) in granted.into_iter().enumerate() {
                // Some attempts succeed, some fail for the infrastructure, some go silent.
                let input = match (round + i as u64) % 3 {
                    0 => result(a, true, FailureClass::None),
                    1 => result(a, false, FailureClass::Infra),
                    _ => continue,
                };
                steps.push(m.step(input, clock));
                steps.push(m.step(credit(), clock));
            }
            steps.push(m.step(Input::Tick, clock));
        }
        steps.push(m.step(
            Input::Cancel {
                run_id: "run-1".into(),
                caller: Principal {
                    id: "client-1".into(),
                    role: crate::credentials::Role::Client,
                    node: None,
                    node_prefix: None,
                },
            },
            clock,
        ));
        let mut results = HashSet::new();
        for fx in &steps {
            for msg in &fx.messages {
                match &msg.body {
                    CoordinatorMessage::Grant(g) => {
                        let a = g.attempt;
                        assert!(fx.writes.iter().any(|w| matches!(w,
                            Write::RecordGrant { task, epoch, .. } if *task == a.task_id && *epoch == a.epoch)),
                            "grant {a:?} without its write");
                    }
                    CoordinatorMessage::ResultAck {
                        attempt: a,
                        accepted: true,
                        reason,
                    } if reason.is_empty() => {
                        assert!(fx.writes.iter().any(|w| matches!(w,
                            Write::EndAttempt { task, epoch, .. } if *task == a.task_id && *epoch == a.epoch)),
                            "ack {a:?} without its write");
                    }
                    CoordinatorMessage::Revoke { attempt: a, reason }
                        if !reason.starts_with("lease lost") =>
                    {
                        assert!(fx.writes.iter().any(|w| matches!(w,
                            Write::EndAttempt { task, epoch, .. } if *task == a.task_id && *epoch == a.epoch)),
                            "revoke {a:?} without its write");
                    }
                    _ => {}
                }
            }
            if let Some(Answer::Cancel(Ok(_))) = &fx.answer {
                assert!(fx.writes.iter().any(|w| matches!(
                    w,
                    Write::SetRunState {
                        state: "cancelled",
                        ..
                    }
                )));
            }
            for (task, _, _) in results_written(fx) {
                assert!(results.insert(task), "a second result row for task {task}");
            }
        }
        assert!(!results.is_empty(), "the scenario finished some tasks");
    }

    #[test]
    fn a_lease_held_at_a_crash_gets_a_grace_period_from_the_start_time() {
        let t = start();
        let task = LoadedTask {
            task_id: 7,
            run_id: "r".into(),
            agent: "synthetic".into(),
            kind: "synthetic".into(),
            affinity_key: "k".into(),
            state: "leased".into(),
            epoch: 3,
            infra_failures: 0,
            node_id: Some("n".into()),
        };
        let run = LoadedRun {
            run_id: "r".into(),
            name: "t".into(),
            sweep_hash: "h".into(),
            state: "running".into(),
            tasks: 1,
            max_attempts: 3,
            created_at_ms: 0,
            finished_at_ms: None,
            owner: String::new(),
        };
        let cfg = CoreConfig {
            lease_ms: 500,
            ..CoreConfig::default()
        };
        let mut m = Machine::load(cfg, vec![run], vec![], vec![task], t);
        assert!(m.step(Input::Tick, after(t, 499)).writes.is_empty());
        let fx = m.step(Input::Tick, after(t, 500));
        assert!(
            fx.writes.iter().any(|w| matches!(
                w,
                Write::EndAttempt {
                    task: 7,
                    epoch: 3,
                    status: "lease_expired",
                    ..
                }
            )),
            "{:?}",
            fx.writes
        );
        // A new run's tasks are numbered after the loaded ones.
        let mut m2 = machine_with_node(60_000, 1, t);
        let (_, fx) = submit(&mut m2, "synthetic:2:1", 3, t);
        assert!(matches!(&fx.writes[0], Write::InsertRun { ids, .. } if ids == &vec![1, 2]));
        let (_, fx) = submit(&mut m2, "synthetic:1:1", 3, t);
        assert!(matches!(&fx.writes[0], Write::InsertRun { ids, .. } if ids == &vec![3]));
    }
}
