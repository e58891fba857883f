//! What agent nodes, the coordinator and its users say to each other, as domain values: a
//! node's registration and the messages of its Work stream both ways, run submissions, and the
//! runs' summaries and progress. The coordinator's machine and driver speak only these;
//! `reprobench_proto::convert` maps them to and from the wire at the coordinator's server.

use crate::outcome::{AttemptRef, Outcome};
use crate::registry::ExecutorKind;
use std::collections::HashMap;

/// Free or registered slots of one executor kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotCount {
    /// The kind.
    pub kind: ExecutorKind,
    /// How many.
    pub slots: u32,
}

/// A node announces itself and its slots.
#[derive(Debug, Clone, PartialEq, Default)]
/// (The protocol version it speaks is checked where it comes in, before it is one.)
pub struct Registration {
    /// The node's name, stable across reconnects.
    pub node_id: String,
    /// Its host.
    pub hostname: String,
    /// Its slots per kind.
    pub slots: Vec<SlotCount>,
    /// Its build's version.
    pub binary_version: String,
    /// Random per node process: another process under a connected node's name is refused.
    pub session: String,
}

/// The coordinator accepts a registration and gives the node its timing (the wire adds the
/// protocol version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// The node.
    pub node_id: String,
    /// A lease lasts this long after its last renewal.
    pub lease_ms: u64,
    /// The node heartbeats this often.
    pub heartbeat_ms: u64,
}

/// The first message on a Work stream.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Hello {
    /// The node.
    pub node_id: String,
    /// Attempts it is still running (after a reconnect).
    pub running: Vec<AttemptRef>,
    /// Its free slots now, per kind.
    pub free: Vec<SlotCount>,
    /// Affinity keys whose environments it has warm.
    pub warm_keys: Vec<String>,
    /// Whether it is draining (takes no new work).
    pub draining: bool,
    /// Its session, as registered.
    pub session: String,
}

/// A node's message on its Work stream.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeMessage {
    /// The stream's first message.
    Hello(Hello),
    /// Sent every heartbeat period: the attempts it runs.
    Heartbeat {
        /// The attempts.
        running: Vec<AttemptRef>,
    },
    /// This many more free slots of a kind.
    Credit(SlotCount),
    /// How far an attempt has got.
    Progress {
        /// The attempt.
        attempt: AttemptRef,
        /// What it does.
        message: String,
        /// How much of it is done, 0 to 1.
        fraction: f64,
    },
    /// An attempt ended.
    Result {
        /// The attempt.
        attempt: AttemptRef,
        /// How it ended.
        outcome: Outcome,
    },
    /// An attempt given back unfinished (draining): requeued without counting as a failure.
    HandBack {
        /// The attempt.
        attempt: AttemptRef,
        /// Why.
        reason: String,
    },
    /// The node takes no new work.
    Draining,
}

/// Work for a node: one attempt of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The attempt.
    pub attempt: AttemptRef,
    /// Its run.
    pub run_id: String,
    /// The executor kind it needs.
    pub kind: ExecutorKind,
    /// Its affinity key (the environment it needs warm).
    pub affinity_key: String,
    /// The agent.
    pub agent: String,
    /// The agent's variant.
    pub variant: String,
    /// The instance.
    pub instance_id: String,
    /// The executor's task description.
    pub payload_json: String,
    /// The lease's length.
    pub lease_ms: u64,
    /// 1-based count of the task's grants.
    pub attempt_number: u32,
    /// The task this node will most likely be granted next for a slot of this kind, when the
    /// grant left it none free: a hint, so that it can prepare that task's first execution
    /// while this one runs (`None`: nothing is pending for it).
    pub upcoming: Option<Upcoming>,
}

/// A task a node will most likely be granted next ([`Grant::upcoming`]): a hint only, never a
/// lease (another node may take it first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upcoming {
    /// The task.
    pub task_id: u64,
    /// The executor's task description (filled by the coordinator's driver from the store).
    pub payload_json: String,
}

/// The coordinator's message on a node's Work stream.
#[derive(Debug, Clone, PartialEq)]
pub enum CoordinatorMessage {
    /// Run this attempt.
    Grant(Grant),
    /// These attempts' leases now run `lease_ms` from the heartbeat.
    Renewal {
        /// The attempts.
        renewed: Vec<AttemptRef>,
        /// The lease's length.
        lease_ms: u64,
    },
    /// Stop an attempt: its lease is gone.
    Revoke {
        /// The attempt.
        attempt: AttemptRef,
        /// Why.
        reason: String,
    },
    /// Stop an attempt: its run was cancelled.
    Cancel {
        /// The attempt.
        attempt: AttemptRef,
        /// Why.
        reason: String,
    },
    /// What became of a result the node sent.
    ResultAck {
        /// The attempt.
        attempt: AttemptRef,
        /// False: the result was fenced off (a stale attempt) or the task is closed.
        accepted: bool,
        /// Why not, when not.
        reason: String,
    },
    /// Finish what runs and take no more.
    Drain {
        /// Why.
        reason: String,
    },
    /// The node's `Draining` was seen: no grant follows, and every grant sent before preceded
    /// this message on the stream.
    DrainingAck,
}

/// A run to start: a sweep and the files it refers to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SubmitRun {
    /// The sweep, as TOML.
    pub sweep_toml: String,
    /// Return an unfinished run of the same sweep instead of starting anew.
    pub resume_existing: bool,
    /// The files the sweep names (`dataset:NAME`, `predictions:PATH`), read by the client.
    pub attachments: HashMap<String, String>,
    /// With `resume_existing`: a finished run of the same sweep is returned too.
    pub reuse_finished: bool,
}

/// The run a submission started or found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The run.
    pub run_id: String,
    /// Its tasks.
    pub tasks: u64,
    /// Whether it is an existing run.
    pub resumed: bool,
}

/// Where a run is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunState {
    /// Tasks are pending or running.
    #[default]
    Running,
    /// Every task has its result.
    Finished,
    /// Cancelled before it finished.
    Cancelled,
}

impl RunState {
    /// The state's name in the store, on the wire and in `status`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Finished => "finished",
            RunState::Cancelled => "cancelled",
        }
    }

    /// The state named `name`, if there is one.
    pub fn parse(name: &str) -> Option<RunState> {
        [RunState::Running, RunState::Finished, RunState::Cancelled]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// A run's counts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunSummary {
    /// The run.
    pub run_id: String,
    /// Its sweep's name.
    pub name: String,
    /// Its state.
    pub state: RunState,
    /// Its tasks.
    pub tasks: u64,
    /// Tasks waiting for a slot.
    pub pending: u64,
    /// Tasks leased to a node.
    pub running: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Tasks that ran to a negative verdict.
    pub failed: u64,
    /// Tasks that ended in an error.
    pub errored: u64,
    /// Tasks withdrawn by a cancel.
    pub cancelled: u64,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When it ended (0 while it runs).
    pub finished_at_ms: i64,
    /// Attempts that ended without a result (lease expired, infra error, hand-back).
    pub retried_attempts: u64,
    /// Kinds its pending tasks need that no connected node offers (the live machine's, empty
    /// from a store).
    pub unserved_kinds: Vec<ExecutorKind>,
}

/// One node's part in a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeProgress {
    /// The node.
    pub node_id: String,
    /// Whether it is connected and takes work.
    pub live: bool,
    /// The run's attempts it holds.
    pub running: u64,
    /// The run's results it delivered.
    pub finished: u64,
    /// Its slots, all kinds.
    pub slots: u32,
}

/// A run's progress for its watchers.
#[derive(Debug, Clone, PartialEq)]
pub struct RunProgress {
    /// Its counts.
    pub run: RunSummary,
    /// The nodes taking part.
    pub nodes: Vec<NodeProgress>,
    /// Seconds left, when there is a rate to tell.
    pub eta_s: Option<f64>,
}

/// Every run the coordinator has, oldest first, and its live nodes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunList {
    /// The runs.
    pub runs: Vec<RunSummary>,
    /// Connected nodes that take work.
    pub live_nodes: u32,
}
