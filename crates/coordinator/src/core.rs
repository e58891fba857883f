//! The coordinator's core: one thread that drives the [`Machine`] and owns the store, the
//! clock, and the channels to nodes and users.
//!
//! Everything that changes state arrives here as a [`Command`]. The core takes a batch of
//! commands, steps the machine with each (then with a tick when one is due, then with a
//! dispatch), applies every step's writes inside one SQLite transaction, commits, and only
//! then sends the replies and messages the batch produced. So every acknowledged change is
//! durable (group commit), and the order of events is the order of this one loop. What to do
//! is the machine's decision ([`crate::machine`]); this module only carries it out.

use crate::machine::{Answer, ConnId, Effects, Input, Machine, Now, Refused, ToNode, Write};
use crate::store::{Store, StoreError};
use reprobench_domain::messages::{
    CoordinatorMessage, Hello, NodeMessage, Registered, Registration, RunList, RunProgress,
    SubmitRun, Submitted,
};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::time::now_ms;
use std::collections::HashMap;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, watch};

pub use crate::machine::CoreConfig;

/// Sender of messages to one node's Work stream, bounded by `serve --max-node-queue`; an error
/// ends the stream.
pub type NodeSender = mpsc::Sender<Result<CoordinatorMessage, Refused>>;

/// Messages waiting for one node (grants, cancels) beyond which a node that does not read its
/// stream is disconnected (`serve --max-node-queue`): far above what a node with thousands of
/// slots is sent at once.
pub const DEFAULT_MAX_NODE_QUEUE: usize = 65_536;

/// A Work stream's sender: its queue holds at most `max` messages (at least 2: one is kept for
/// the overflow's explanation).
pub fn node_channel(
    max: usize,
) -> (
    NodeSender,
    mpsc::Receiver<Result<CoordinatorMessage, Refused>>,
) {
    mpsc::channel(max.max(2))
}
/// Sender of progress events to one WatchRun stream.
pub type WatchSender = mpsc::Sender<Result<RunProgress, Refused>>;

/// Everything the core is asked to do.
pub enum Command {
    /// A node registers.
    Register {
        req: Registration,
        reply: oneshot::Sender<Result<Registered, Refused>>,
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
        body: NodeMessage,
    },
    /// A Work stream ended.
    Disconnect { node_id: String, conn: u64 },
    /// SubmitRun.
    Submit {
        req: SubmitRun,
        /// The submitting credential's id.
        owner: String,
        reply: oneshot::Sender<Result<Submitted, Refused>>,
    },
    /// CancelRun.
    Cancel {
        run_id: String,
        /// Who asks (only the run's submitter or an admin may).
        caller: crate::credentials::Principal,
        reply: oneshot::Sender<Result<u64, Refused>>,
    },
    /// ListRuns.
    List { reply: oneshot::Sender<RunList> },
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
    /// Attempts each connected node holds, by node id (what the pods' deletion costs follow).
    NodeLoads {
        reply: oneshot::Sender<Vec<(String, u64)>>,
    },
    /// Stop the core (after committing what it has).
    Shutdown,
}

/// Tasks of one executor kind waiting for a slot and holding one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindCounts {
    /// Executor kind.
    pub kind: ExecutorKind,
    /// Tasks waiting for a slot.
    pub pending: u64,
    /// Tasks leased to a node.
    pub running: u64,
}

/// A cloneable handle to send commands to the core.
#[derive(Clone)]
pub struct CoreHandle {
    tx: std_mpsc::Sender<Command>,
    failure: CoreFailure,
}

/// Why the core stopped on its own, once it has: a store write failed, so memory would be ahead
/// of the store, and the coordinator must stop and be restarted (it resumes from what was
/// committed). Whoever runs the coordinator waits on it; the library never exits the process.
#[derive(Clone)]
pub struct CoreFailure(watch::Receiver<Option<String>>);

impl CoreFailure {
    /// The failure, if the core has stopped on one.
    pub fn get(&self) -> Option<String> {
        self.0.borrow().clone()
    }

    /// Waits until the core stops on a failure and says why; never returns while it is healthy
    /// (nor after a clean shutdown).
    pub async fn wait(&mut self) -> String {
        match self.0.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }
}

impl CoreHandle {
    /// A handle whose commands arrive on the returned receiver instead of a core (for tests of
    /// what sends them).
    #[cfg(test)]
    pub(crate) fn channel() -> (CoreHandle, std_mpsc::Receiver<Command>) {
        let (tx, rx) = std_mpsc::channel();
        // No core to fail: the sender goes, and the failure stays `None` (`wait` never ends).
        let (_, failure) = watch::channel(None);
        (
            CoreHandle {
                tx,
                failure: CoreFailure(failure),
            },
            rx,
        )
    }

    /// Sends a command; fails when the core has stopped, saying why if it stopped on a failure.
    pub fn send(&self, cmd: Command) -> Result<(), Refused> {
        self.tx.send(cmd).map_err(|_| self.stopped())
    }

    /// What a caller hears when the core has stopped: why, if it stopped on a failure.
    pub fn stopped(&self) -> Refused {
        match self.failure.get() {
            Some(why) => Refused::Unavailable(format!(
                "the coordinator stopped: {why}; restart it on the same data directory (its runs resume from what the store holds)"
            )),
            None => Refused::Unavailable("the coordinator is shutting down; retry shortly".into()),
        }
    }

    /// Why the core stopped on its own, when it does.
    pub fn failure(&self) -> CoreFailure {
        self.failure.clone()
    }
}

/// Opens the core on a store and starts its thread.
pub fn spawn(
    store: Store,
    cfg: CoreConfig,
) -> Result<(CoreHandle, std::thread::JoinHandle<()>), StoreError> {
    let core = Core::load(store, cfg)?;
    let (tx, rx) = std_mpsc::channel();
    let (failed, failure) = watch::channel(None);
    let join = std::thread::Builder::new()
        .name("coordinator-core".into())
        .spawn(move || core.run(rx, failed))
        .expect("spawning the core thread");
    let failure = CoreFailure(failure);
    Ok((CoreHandle { tx, failure }, join))
}

/// The clock, read by the driver alone.
fn clock() -> Now {
    Now {
        at: Instant::now(),
        wall_ms: now_ms(),
    }
}

/// Who waits for a command's answer, and how to reach them.
enum Asker {
    Nobody,
    Register(oneshot::Sender<Result<Registered, Refused>>),
    Connect(ConnId, String, NodeSender),
    Submit(oneshot::Sender<Result<Submitted, Refused>>),
    Cancel(oneshot::Sender<Result<u64, Refused>>),
    List(oneshot::Sender<RunList>),
    Watch(String, WatchSender),
    Counts(oneshot::Sender<Vec<KindCounts>>),
    NodeLoads(oneshot::Sender<Vec<(String, u64)>>),
}

/// Something to send once the batch is committed.
enum Deferred {
    Node(ConnId, NodeSender, Box<CoordinatorMessage>),
    Reply(Box<dyn FnOnce() + Send>),
}

fn reply<T: Send + 'static>(tx: oneshot::Sender<T>, value: T) -> Deferred {
    Deferred::Reply(Box::new(move || {
        let _ = tx.send(value);
    }))
}

/// A command as the machine's input and the one who waits for its answer (none for Shutdown).
fn split(cmd: Command, now: Now) -> Option<(Input, Asker)> {
    Some(match cmd {
        Command::Register { req, reply } => (Input::Register(req), Asker::Register(reply)),
        Command::Connect {
            node_id,
            conn,
            hello,
            out,
        } => (
            Input::Connect {
                node_id: node_id.clone(),
                conn,
                hello,
            },
            Asker::Connect(conn, node_id, out),
        ),
        Command::FromNode {
            node_id,
            conn,
            body,
        } => (
            Input::FromNode {
                node_id,
                conn,
                body,
            },
            Asker::Nobody,
        ),
        Command::Disconnect { node_id, conn } => {
            (Input::Disconnect { node_id, conn }, Asker::Nobody)
        }
        Command::Submit { req, owner, reply } => (
            Input::Submit {
                req,
                run_id: new_run_id(now.wall_ms),
                owner,
            },
            Asker::Submit(reply),
        ),
        Command::Cancel {
            run_id,
            caller,
            reply,
        } => (Input::Cancel { run_id, caller }, Asker::Cancel(reply)),
        Command::List { reply } => (Input::List, Asker::List(reply)),
        Command::Watch { run_id, tx } => (
            Input::Watch {
                run_id: run_id.clone(),
            },
            Asker::Watch(run_id, tx),
        ),
        Command::NodeGone { node_id, reason } => {
            (Input::NodeGone { node_id, reason }, Asker::Nobody)
        }
        Command::Counts { reply } => (Input::Counts, Asker::Counts(reply)),
        Command::NodeLoads { reply } => (Input::NodeLoads, Asker::NodeLoads(reply)),
        Command::Shutdown => return None,
    })
}

/// Applies one of the machine's writes to the store.
fn apply_write(store: &Store, write: Write) -> Result<(), StoreError> {
    match write {
        Write::UpsertNode {
            node_id,
            hostname,
            slots,
            at_ms,
        } => store.upsert_node(&node_id, &hostname, &slots, at_ms),
        Write::InsertRun {
            run,
            sweep_toml,
            attachments_json,
            ids,
            tasks,
        } => store.insert_run(&run, &sweep_toml, &attachments_json, &ids, &tasks),
        Write::SetRunState {
            run_id,
            state,
            finished_at_ms,
        } => store.set_run_state(&run_id, state, finished_at_ms),
        Write::RecordGrant {
            task,
            epoch,
            node_id,
            at_ms,
        } => store.record_grant(task, epoch, &node_id, at_ms),
        Write::EndAttempt {
            task,
            epoch,
            status,
            reason,
            at_ms,
        } => store.end_attempt(task, epoch, status, reason.as_deref(), at_ms),
        Write::MarkLateResult { task, epoch, at_ms } => store.mark_late_result(task, epoch, at_ms),
        Write::SetTaskState {
            task,
            state,
            infra_failures,
        } => store.set_task_state(task, state.as_str(), infra_failures),
        Write::InsertResult {
            task,
            run_id,
            epoch,
            record,
        } => store.insert_result(task, &run_id, epoch, &record),
    }
}

/// The driver: the machine, the store it writes, and the open streams.
struct Core {
    store: Store,
    machine: Machine,
    /// The open Work streams: their node and sender.
    streams: HashMap<ConnId, (String, NodeSender)>,
    /// Streams whose queue overflowed: disconnected at the start of the next batch.
    overflowed: Vec<ConnId>,
    /// The WatchRun streams, by run.
    watchers: HashMap<String, Vec<WatchSender>>,
    /// What the batch under way will send after its commit.
    deferred: Vec<Deferred>,
}

impl Core {
    fn load(store: Store, cfg: CoreConfig) -> Result<Core, StoreError> {
        let runs = store.load_runs()?;
        let durations = store.load_durations()?;
        let tasks = store.load_tasks(None)?;
        let machine = Machine::load(cfg, runs, durations, tasks, clock());
        Ok(Core {
            store,
            machine,
            streams: HashMap::new(),
            overflowed: Vec::new(),
            watchers: HashMap::new(),
            deferred: Vec::new(),
        })
    }

    /// Serves commands until shutdown (or until every handle is gone). At the first failed store
    /// write memory is ahead of the store: the core stops and says so on `failed` (before the
    /// batch's askers hear their replies dropped), and its owner stops the coordinator, so that a
    /// restart resumes from what was committed.
    fn run(mut self, rx: std_mpsc::Receiver<Command>, failed: watch::Sender<Option<String>>) {
        let tick = self.machine.tick_interval();
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
            if let Err(e) = self.batch(&mut batch, &mut next_tick, tick) {
                tracing::error!(error = %e, "store write failed; the coordinator stops");
                failed.send_replace(Some(format!("its store write failed: {e}")));
                return;
            }
            if shutdown {
                return;
            }
        }
    }

    /// Steps the machine through a batch, writes and commits, then sends.
    fn batch(
        &mut self,
        batch: &mut Vec<Command>,
        next_tick: &mut Instant,
        tick: Duration,
    ) -> Result<(), StoreError> {
        // A node that let its queue fill is gone for the machine: its work goes back.
        for conn in std::mem::take(&mut self.overflowed) {
            if let Some((node_id, _)) = self.streams.get(&conn) {
                batch.insert(
                    0,
                    Command::Disconnect {
                        node_id: node_id.clone(),
                        conn,
                    },
                );
            }
        }
        self.store.begin()?;
        for cmd in batch.drain(..) {
            let closed = match &cmd {
                Command::Disconnect { conn, .. } => Some(*conn),
                _ => None,
            };
            let now = clock();
            let Some((input, asker)) = split(cmd, now) else {
                continue;
            };
            let fx = self.machine.step(input, now);
            self.carry_out(fx, asker)?;
            // What the batch already queued for it still goes out, as to any closed stream.
            if let Some(conn) = closed {
                self.streams.remove(&conn);
            }
        }
        let now = clock();
        if now.at >= *next_tick {
            let fx = self.machine.step(Input::Tick, now);
            self.carry_out(fx, Asker::Nobody)?;
            *next_tick = now.at + tick;
        }
        let fx = self.machine.step(Input::Dispatch, now);
        self.carry_out(fx, Asker::Nobody)?;
        self.store.commit()?;
        for deferred in std::mem::take(&mut self.deferred) {
            match deferred {
                Deferred::Node(conn, tx, body) => self.send_to_node(conn, &tx, *body),
                Deferred::Reply(f) => f(),
            }
        }
        self.publish(now.at);
        Ok(())
    }

    /// Queues a message on a node's stream. When only one place is left, the node is not
    /// reading: it gets an error naming the limit instead, and is disconnected at the next batch.
    fn send_to_node(&mut self, conn: ConnId, tx: &NodeSender, body: CoordinatorMessage) {
        if self.overflowed.contains(&conn) {
            return;
        }
        if tx.capacity() > 1 {
            let _ = tx.try_send(Ok(body));
            return;
        }
        let limit = tx.max_capacity();
        let node = self
            .streams
            .get(&conn)
            .map(|(node, _)| node.as_str())
            .unwrap_or_default();
        tracing::warn!(
            node,
            limit,
            "a node's outbound queue is full: disconnecting it"
        );
        let _ = tx.try_send(Err(Refused::ResourceExhausted(format!(
            "node `{node}` let {limit} messages from the coordinator wait unread, its limit; the coordinator closed the stream, and what it had sent goes back when the node reconnects or its leases expire. If the node is merely slow to read, start the coordinator with a larger --max-node-queue"
        ))));
        self.overflowed.push(conn);
    }

    /// Applies a step's writes now and queues its messages and answer for after the commit.
    fn carry_out(&mut self, fx: Effects, asker: Asker) -> Result<(), StoreError> {
        let Effects {
            writes,
            messages,
            answer,
        } = fx;
        for write in writes {
            apply_write(&self.store, write)?;
        }
        // A stream is open once the machine accepts it, so the messages of its step reach it.
        match (asker, answer) {
            (Asker::Nobody, None) => {}
            (Asker::Register(tx), Some(Answer::Register(v))) => self.deferred.push(reply(tx, v)),
            (Asker::Connect(conn, node_id, out), Some(Answer::Connect(Ok(())))) => {
                self.streams.insert(conn, (node_id, out));
            }
            (Asker::Connect(_, _, out), Some(Answer::Connect(Err(refused)))) => {
                let _ = out.try_send(Err(refused));
            }
            (Asker::Submit(tx), Some(Answer::Submit(v))) => self.deferred.push(reply(tx, v)),
            (Asker::Cancel(tx), Some(Answer::Cancel(v))) => self.deferred.push(reply(tx, v)),
            (Asker::List(tx), Some(Answer::List(v))) => self.deferred.push(reply(tx, v)),
            (Asker::Counts(tx), Some(Answer::Counts(v))) => self.deferred.push(reply(tx, v)),
            (Asker::NodeLoads(tx), Some(Answer::NodeLoads(v))) => self.deferred.push(reply(tx, v)),
            (Asker::Watch(run_id, tx), Some(Answer::Watch(Ok(())))) => {
                self.watchers.entry(run_id).or_default().push(tx);
            }
            (Asker::Watch(_, tx), Some(Answer::Watch(Err(refused)))) => {
                let _ = tx.try_send(Err(refused));
            }
            (_, answer) => unreachable!("the machine answered {answer:?} to another question"),
        }
        for ToNode { conn, mut body } in messages {
            let Some((_, tx)) = self.streams.get(&conn) else {
                continue;
            };
            if let CoordinatorMessage::Grant(grant) = &mut body {
                let task = grant.attempt.task_id;
                let info = self.store.grant_info(task)?;
                grant.variant = info.variant;
                grant.instance_id = info.instance_id;
                grant.payload_json = info.payload;
                if let Some(upcoming) = &mut grant.upcoming {
                    upcoming.payload_json = self.store.grant_info(upcoming.task_id)?.payload;
                }
            }
            self.deferred
                .push(Deferred::Node(conn, tx.clone(), Box::new(body)));
        }
        Ok(())
    }

    /// Sends progress snapshots to watchers (the machine throttles them), and ends the watches
    /// of finished runs.
    fn publish(&mut self, now: Instant) {
        let machine = &mut self.machine;
        self.watchers.retain(|run_id, watchers| {
            if let Some((progress, done)) = machine.publish(run_id, now) {
                watchers.retain(|w| {
                    !matches!(
                        w.try_send(Ok(progress.clone())),
                        Err(mpsc::error::TrySendError::Closed(_))
                    )
                });
                if done {
                    watchers.clear();
                }
            }
            !watchers.is_empty()
        });
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

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_domain::messages::{Grant, RunState, RunSummary, SlotCount};
    use reprobench_domain::outcome::{AttemptRef, FailureClass, Outcome};

    /// A core on a temporary store, with one fake node's channels.
    struct Harness {
        _dir: tempfile::TempDir,
        core: CoreHandle,
        join: Option<std::thread::JoinHandle<()>>,
        out: mpsc::Receiver<Result<CoordinatorMessage, Refused>>,
    }

    fn ask<T>(core: &CoreHandle, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> T {
        let (tx, rx) = oneshot::channel();
        core.send(make(tx)).unwrap();
        rx.blocking_recv().unwrap()
    }

    impl Harness {
        fn new(lease_ms: u64) -> Harness {
            Harness::with_slots(
                lease_ms,
                &[(ExecutorKind::Synthetic, 4)],
                &[(ExecutorKind::Synthetic, 1)],
            )
        }

        /// A node `n` registered with `registered` slots whose hello offers `free` of them.
        fn with_slots(
            lease_ms: u64,
            registered: &[(ExecutorKind, u32)],
            free: &[(ExecutorKind, u32)],
        ) -> Harness {
            Harness::with_queue(lease_ms, registered, free, DEFAULT_MAX_NODE_QUEUE)
        }

        /// As [`Harness::with_slots`], the node's stream holding at most `max_queue` messages.
        fn with_queue(
            lease_ms: u64,
            registered: &[(ExecutorKind, u32)],
            free: &[(ExecutorKind, u32)],
            max_queue: usize,
        ) -> Harness {
            let slots = |list: &[(ExecutorKind, u32)]| -> Vec<SlotCount> {
                list.iter()
                    .map(|&(kind, slots)| SlotCount { kind, slots })
                    .collect()
            };
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            let cfg = CoreConfig {
                lease_ms,
                heartbeat_ms: lease_ms / 4,
                ..CoreConfig::default()
            };
            let (core, join) = spawn(store, cfg).unwrap();
            let req = Registration {
                node_id: "n".into(),
                hostname: "h".into(),
                slots: slots(registered),
                binary_version: "t".into(),
                session: String::new(),
            };
            ask(&core, |reply| Command::Register { req, reply }).unwrap();
            let (tx, out) = node_channel(max_queue);
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
            let req = SubmitRun {
                sweep_toml: sweep,
                ..Default::default()
            };
            ask(&self.core, |reply| Command::Submit {
                req,
                owner: "test".into(),
                reply,
            })
            .unwrap()
            .run_id
        }

        /// Node `n` opens stream `conn` anew (a default queue), offering `free` synthetic slots.
        fn reconnect(&mut self, conn: u64, free: u32) {
            let (tx, out) = node_channel(DEFAULT_MAX_NODE_QUEUE);
            self.out = out;
            let hello = Hello {
                node_id: "n".into(),
                free: vec![SlotCount {
                    kind: ExecutorKind::Synthetic,
                    slots: free,
                }],
                ..Default::default()
            };
            self.core
                .send(Command::Connect {
                    node_id: "n".into(),
                    conn,
                    hello,
                    out: tx,
                })
                .unwrap();
        }

        fn send(&self, body: NodeMessage) {
            self.core
                .send(Command::FromNode {
                    node_id: "n".into(),
                    conn: 1,
                    body,
                })
                .unwrap();
        }

        /// The next message of the wanted kind (skipping lease renewals).
        fn next(&mut self) -> CoordinatorMessage {
            loop {
                let m = self.out.blocking_recv().expect("core alive").unwrap();
                if !matches!(m, CoordinatorMessage::Renewal { .. }) {
                    return m;
                }
            }
        }

        fn grant(&mut self) -> Grant {
            match self.next() {
                CoordinatorMessage::Grant(g) => g,
                other => panic!("expected a grant, got {other:?}"),
            }
        }

        /// Whether the next result acknowledgement accepts, and why not.
        fn ack(&mut self) -> (bool, String) {
            match self.next() {
                CoordinatorMessage::ResultAck {
                    accepted, reason, ..
                } => (accepted, reason),
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
            failure_class: class,
            wall_s: 0.1,
            ..Default::default()
        }
    }

    fn result(attempt: AttemptRef, outcome: Outcome) -> NodeMessage {
        NodeMessage::Result { attempt, outcome }
    }

    #[test]
    fn idle_credit_is_used_by_work_submitted_later_and_results_are_idempotent() {
        let mut h = Harness::new(60_000);
        let run = h.submit("synthetic:2:1", 3);
        let g = h.grant();
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().0);
        // The same result again (a resend after a reconnect) is acknowledged, not recorded twice.
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().0);
        h.send(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }));
        let g2 = h.grant();
        assert_ne!(g2.attempt.task_id, g.attempt.task_id);
        h.send(result(g2.attempt, outcome(false, FailureClass::None)));
        assert!(h.ack().0);
        let s = h.summary(&run);
        assert_eq!((s.state, s.succeeded, s.failed), (RunState::Finished, 1, 1));
        // A credit left over while idle is used by a run submitted later.
        h.send(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }));
        h.send(NodeMessage::Heartbeat { running: vec![] });
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
        assert!(h.ack().0);
        h.send(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }));
        let g2 = h.grant();
        assert_eq!(g2.attempt.epoch, 2);
        assert_eq!(g2.attempt_number, 2);
        // A result for the first attempt is fenced off.
        h.send(result(g1.attempt, outcome(true, FailureClass::None)));
        let (accepted, reason) = h.ack();
        assert!(!accepted && reason.contains("stale"), "{reason}");
        h.send(result(g2.attempt, outcome(false, FailureClass::Infra)));
        assert!(h.ack().0);
        let s = h.summary(&run);
        assert_eq!((s.state, s.errored), (RunState::Finished, 1), "{s:?}");
    }

    #[test]
    fn a_failed_store_write_stops_the_core_and_its_callers_hear_why() {
        let mut h = Harness::new(60_000);
        let mut failure = h.core.failure();
        assert_eq!(failure.get(), None);
        // Another process holds the store's write lock: the submit's write fails once SQLite's
        // busy timeout has passed.
        let blocker =
            rusqlite::Connection::open(h._dir.path().join(crate::store::DB_FILE)).unwrap();
        blocker.execute_batch("BEGIN EXCLUSIVE;").unwrap();
        let (reply, answer) = oneshot::channel();
        let req = SubmitRun {
            sweep_toml: "name='t'\ndatasets=['synthetic:1:1']\n[[agents]]\nname='synthetic'\n"
                .into(),
            ..Default::default()
        };
        h.core
            .send(Command::Submit {
                req,
                owner: "test".into(),
                reply,
            })
            .unwrap();
        assert!(
            answer.blocking_recv().is_err(),
            "the failed batch's reply is dropped"
        );
        let why = failure.get().expect("the core says why it stopped");
        assert!(why.contains("store write failed"), "{why}");
        let waited = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(failure.wait());
        assert_eq!(waited, why);
        h.join.take().unwrap().join().unwrap();
        let (reply, _answer) = oneshot::channel();
        let refused = h.core.send(Command::List { reply }).unwrap_err();
        assert!(
            matches!(&refused, Refused::Unavailable(m) if m.contains(&why)),
            "{refused:?}"
        );
        blocker.execute_batch("ROLLBACK;").unwrap();
    }

    #[test]
    fn a_node_offering_several_kinds_gets_work_of_whichever_kind_has_some() {
        // Found on a real cluster: a pod offering sim and synthetic slots was never given
        // synthetic work when its credits listed sim first (a HashMap's order), and a run
        // stalled. Every kind, work of the one whose name sorts last: order cannot hide it.
        let offered: Vec<(ExecutorKind, u32)> = ExecutorKind::ALL.map(|k| (k, 1)).to_vec();
        let mut h = Harness::with_slots(60_000, &offered, &offered);
        let run = h.submit("synthetic:2:1", 3);
        assert_eq!(h.summary(&run).running, 1, "one synthetic slot, one grant");
        let g = h.grant();
        assert_eq!(g.kind, ExecutorKind::Synthetic);
        h.send(result(g.attempt, outcome(true, FailureClass::None)));
        assert!(h.ack().0);
        // Its synthetic credit comes back: the second task goes to it too.
        h.send(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }));
        let g2 = h.grant();
        assert_ne!(g2.attempt.task_id, g.attempt.task_id);
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
                kind: ExecutorKind::Synthetic,
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
            CoordinatorMessage::Revoke { attempt, reason } => {
                assert_eq!(attempt, g1.attempt);
                assert!(reason.contains("node pod n was deleted"), "{reason}");
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
        assert!(!h.ack().0);
        // An unknown node is no error.
        h.core
            .send(Command::NodeGone {
                node_id: "never-seen".into(),
                reason: "x".into(),
            })
            .unwrap();
        assert_eq!(h.summary(&run).pending, 2);

        // The gone node, still connected for a moment, asks for more work: it gets none.
        h.send(NodeMessage::Credit(SlotCount {
            kind: ExecutorKind::Synthetic,
            slots: 1,
        }));
        assert_eq!(h.summary(&run).pending, 2);
        while let Ok(m) = h.out.try_recv() {
            let body = m.unwrap();
            assert!(
                !matches!(body, CoordinatorMessage::Grant(_)),
                "a gone node was granted work: {body:?}"
            );
        }
        // A new pod of the same name connects anew and is given work.
        h.reconnect(2, 1);
        let g = h.grant();
        assert_eq!(g.run_id, run);
    }

    #[test]
    fn a_node_that_lets_its_queue_fill_is_told_the_limit_and_disconnected() {
        let four = [(ExecutorKind::Synthetic, 4)];
        let mut h = Harness::with_queue(60_000, &four, &four, 2);
        let run = h.submit("synthetic:4:1", 3);
        // The node reads nothing until the core has sent what it would: a later command's
        // answer comes after the submission's batch has queued its grants.
        h.summary(&run);
        let mut grants = 0;
        let refusal = loop {
            match h.out.try_recv() {
                Ok(Ok(m)) => {
                    if matches!(m, CoordinatorMessage::Grant(_)) {
                        grants += 1;
                    }
                }
                Ok(Err(status)) => break status,
                Err(e) => panic!("no refusal in the queue after {grants} grants: {e}"),
            }
        };
        assert!(
            matches!(&refusal, Refused::ResourceExhausted(m) if m.contains("--max-node-queue")),
            "{refusal:?}"
        );
        assert!(grants < 4, "{grants} grants fit a queue of 2");
        // The stream ends: the core dropped the node.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match h.out.try_recv() {
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Ok(Err(refused)) => panic!("a second refusal: {refused:?}"),
                _ => {
                    assert!(Instant::now() < deadline, "the stream stayed open");
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        // Reconnected with room, the node is given the run's work again.
        h.reconnect(2, 4);
        assert_eq!(h.grant().run_id, run);
    }

    #[test]
    fn an_expired_lease_is_revoked_and_requeued() {
        let mut h = Harness::new(200);
        let run = h.submit("synthetic:1:1", 3);
        let g1 = h.grant();
        // No heartbeat: the lease runs out, the node is told, and the task is pending again.
        match h.next() {
            CoordinatorMessage::Revoke { attempt, reason } => {
                assert_eq!(attempt, g1.attempt);
                assert!(reason.contains("lease expired"), "{reason}");
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
