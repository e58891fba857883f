//! The durable store: one SQLite file (WAL) holding runs, tasks, attempts, nodes and results.
//!
//! Only the coordinator's core writes it, in one transaction per batch of events, committed
//! before any reply or grant of that batch leaves the process. Readers (`status`, `results`
//! with `--data`) open it read-only; WAL lets them read while the coordinator writes.

use crate::review::{self, HumanVerdict, Refusal, Review, ReviewState};
use reprobench_domain::messages::{RunState, RunSummary};
use reprobench_domain::results::ResultRow;
use reprobench_domain::time::rfc3339_ms;
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};
use std::path::{Path, PathBuf};

/// The database file inside a data directory.
pub const DB_FILE: &str = "reprobench.sqlite";

/// Store failures. The coordinator cannot go on safely after a failed write, so it stops;
/// a restart resumes from what was committed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite reported an error.
    #[error("store {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// The SQLite error.
        source: rusqlite::Error,
    },
    /// No store exists where one was expected.
    #[error(
        "no reprobench store at {0}; pass the --data DIR that `reprobench serve` or `reprobench run` used"
    )]
    Missing(PathBuf),
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS runs(
  run_id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  sweep_toml TEXT NOT NULL,
  sweep_hash TEXT NOT NULL,
  state TEXT NOT NULL,
  tasks INTEGER NOT NULL,
  max_attempts INTEGER NOT NULL,
  created_at_ms INTEGER NOT NULL,
  finished_at_ms INTEGER,
  attachments TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS tasks(
  task_id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  track TEXT NOT NULL,
  dataset TEXT NOT NULL,
  instance_id TEXT NOT NULL,
  repo_or_app TEXT NOT NULL,
  bug_type TEXT,
  agent TEXT NOT NULL,
  variant TEXT NOT NULL,
  backbone TEXT NOT NULL,
  repeat INTEGER NOT NULL,
  kind TEXT NOT NULL,
  affinity_key TEXT NOT NULL,
  payload TEXT NOT NULL,
  ground_truth_actions INTEGER,
  state TEXT NOT NULL,
  epoch INTEGER NOT NULL DEFAULT 0,
  infra_failures INTEGER NOT NULL DEFAULT 0,
  node_id TEXT
);
CREATE INDEX IF NOT EXISTS tasks_by_run ON tasks(run_id, state);
CREATE TABLE IF NOT EXISTS attempts(
  task_id INTEGER NOT NULL,
  epoch INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  granted_at_ms INTEGER NOT NULL,
  ended_at_ms INTEGER,
  status TEXT NOT NULL,
  reason TEXT,
  late_result_rejected_at_ms INTEGER,
  PRIMARY KEY(task_id, epoch)
);
CREATE TABLE IF NOT EXISTS nodes(
  node_id TEXT PRIMARY KEY,
  hostname TEXT NOT NULL,
  slots TEXT NOT NULL,
  registered_at_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS results(
  task_id INTEGER PRIMARY KEY,
  run_id TEXT NOT NULL,
  epoch INTEGER NOT NULL,
  success INTEGER NOT NULL,
  verdict TEXT NOT NULL,
  error_class TEXT,
  error_message TEXT,
  llm_calls INTEGER NOT NULL,
  tokens_in INTEGER NOT NULL,
  tokens_out INTEGER NOT NULL,
  tokens_cached INTEGER NOT NULL,
  cost_usd REAL NOT NULL,
  wall_s REAL NOT NULL,
  actions INTEGER,
  trace_len INTEGER,
  feedback_iterations INTEGER,
  localized_files_correct INTEGER,
  started_at_ms INTEGER NOT NULL,
  finished_at_ms INTEGER NOT NULL,
  node_id TEXT NOT NULL,
  artifact_path TEXT NOT NULL,
  details TEXT
);
CREATE INDEX IF NOT EXISTS results_by_run ON results(run_id);
CREATE TABLE IF NOT EXISTS reviews(
  review_id INTEGER PRIMARY KEY,
  task_id INTEGER NOT NULL,
  reviewer TEXT NOT NULL,
  verdict TEXT NOT NULL,
  note TEXT,
  created_at_ms INTEGER NOT NULL,
  UNIQUE(task_id, reviewer)
);
"#;

/// Task states as stored.
pub mod state {
    /// Waiting for a slot.
    pub const PENDING: &str = "pending";
    /// Granted to a node under a lease.
    pub const LEASED: &str = "leased";
    /// Finished, success.
    pub const SUCCEEDED: &str = "succeeded";
    /// Finished, the agent ran but did not succeed.
    pub const FAILED: &str = "failed";
    /// Finished with an error (agent error, bad input, or attempts exhausted).
    pub const ERRORED: &str = "errored";
    /// Withdrawn by a cancel.
    pub const CANCELLED: &str = "cancelled";
}

/// A new task row.
#[derive(Debug, Clone)]
pub struct NewTask {
    /// `swt`, `android` or `synthetic`.
    pub track: String,
    /// Dataset name.
    pub dataset: String,
    /// Instance id.
    pub instance_id: String,
    /// Repository or app.
    pub repo_or_app: String,
    /// `crash`, `non-crash` or none.
    pub bug_type: Option<String>,
    /// Agent name.
    pub agent: String,
    /// Variant name.
    pub variant: String,
    /// Backbone name.
    pub backbone: String,
    /// Repeat index, from 0.
    pub repeat: u32,
    /// Executor kind.
    pub kind: reprobench_domain::registry::ExecutorKind,
    /// Affinity key.
    pub affinity_key: String,
    /// Executor payload (JSON).
    pub payload: String,
    /// Android: actions in the ground-truth reproduction.
    pub ground_truth_actions: Option<u32>,
}

/// A task as loaded at start-up (everything the core keeps in memory).
#[derive(Debug, Clone)]
pub struct LoadedTask {
    /// Row id.
    pub task_id: u64,
    /// Run.
    pub run_id: String,
    /// Agent.
    pub agent: String,
    /// Executor kind.
    pub kind: String,
    /// Affinity key.
    pub affinity_key: String,
    /// Stored state.
    pub state: String,
    /// Grants so far.
    pub epoch: u64,
    /// Attempts lost to infrastructure.
    pub infra_failures: u32,
    /// Node of the current lease.
    pub node_id: Option<String>,
}

/// A run as loaded at start-up.
#[derive(Debug, Clone)]
pub struct LoadedRun {
    /// Id.
    pub run_id: String,
    /// Sweep name.
    pub name: String,
    /// Hash of the canonical sweep spec.
    pub sweep_hash: String,
    /// `running`, `finished` or `cancelled`.
    pub state: String,
    /// Number of tasks.
    pub tasks: u64,
    /// Attempt bound.
    pub max_attempts: u32,
    /// Creation time.
    pub created_at_ms: i64,
    /// Finish time.
    pub finished_at_ms: Option<i64>,
    /// Id of the credential that submitted it ("" for runs from before credentials).
    pub owner: String,
}

/// What the grant message needs from a task row.
#[derive(Debug, Clone)]
pub struct GrantInfo {
    /// Instance id.
    pub instance_id: String,
    /// Variant.
    pub variant: String,
    /// Executor payload (JSON).
    pub payload: String,
}

/// A finished task's figures, as the node reported them.
#[derive(Debug, Clone, Default)]
pub struct ResultRecord {
    /// Success.
    pub success: bool,
    /// Verdict string.
    pub verdict: String,
    /// Error class, if any.
    pub error_class: Option<String>,
    /// Error message, if any.
    pub error_message: Option<String>,
    /// LLM calls.
    pub llm_calls: u64,
    /// Input tokens.
    pub tokens_in: u64,
    /// Output tokens.
    pub tokens_out: u64,
    /// Cached input tokens.
    pub tokens_cached: u64,
    /// Dollars.
    pub cost_usd: f64,
    /// Wall seconds.
    pub wall_s: f64,
    /// Android actions.
    pub actions: Option<u32>,
    /// Android trace length.
    pub trace_len: Option<u32>,
    /// SWT feedback iterations.
    pub feedback_iterations: Option<u32>,
    /// SWT localization correctness.
    pub localized_files_correct: Option<bool>,
    /// Start, epoch ms.
    pub started_at_ms: i64,
    /// End, epoch ms.
    pub finished_at_ms: i64,
    /// Node that produced it.
    pub node_id: String,
    /// Artifact location.
    pub artifact_path: String,
    /// Track-specific report (JSON).
    pub details_json: Option<String>,
}

/// One attempt, for `status --attempts`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttemptRow {
    /// Task.
    pub task_id: u64,
    /// Instance.
    pub instance_id: String,
    /// Grant number.
    pub epoch: u64,
    /// Node.
    pub node_id: String,
    /// `running`, `finished`, `lease_expired`, `infra_error`, `handed_back`, `lost`, `cancelled`, `revoked`.
    pub status: String,
    /// Why it ended as it did.
    pub reason: Option<String>,
    /// When a result for this attempt arrived after its lease had passed to another attempt.
    pub late_result_rejected_at_ms: Option<i64>,
}

/// A result in a run's review queue: android, non-crash, finished without an error.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReviewItem {
    /// Task (and result row) id.
    pub task_id: u64,
    /// Instance.
    pub instance_id: String,
    /// Agent.
    pub agent: String,
    /// Variant.
    pub variant: String,
    /// Backbone.
    pub backbone: String,
    /// Repeat index.
    pub repeat: u32,
    /// The automatic success, before any review.
    pub auto_success: bool,
    /// The automatic verdict, before any review.
    pub auto_verdict: String,
    /// Success as the results show it now.
    pub success: bool,
    /// Verdict as the results show it now.
    pub verdict: String,
    /// Where the trace and screenshots are.
    pub artifact_path: String,
    /// Where the item is in the protocol.
    pub state: ReviewState,
    /// The final human verdict, once agreed or decided.
    pub final_verdict: Option<HumanVerdict>,
    /// Reviews in the order they were given.
    pub reviews: Vec<Review>,
}

impl ReviewItem {
    /// Whether the final human verdict differs from the automatic one.
    pub fn changed(&self) -> bool {
        self.final_verdict
            .is_some_and(|v| v.success() != self.auto_success)
    }
}

/// The SQLite store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the store in `data_dir` for writing.
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        let path = data_dir.join(DB_FILE);
        let conn = Connection::open(&path).map_err(|source| StoreError::Sqlite {
            path: path.clone(),
            source,
        })?;
        let store = Store { conn, path };
        store
            .conn
            .execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;",
            )
            .map_err(|e| store.err(e))?;
        store.conn.execute_batch(SCHEMA).map_err(|e| store.err(e))?;
        store.migrate()?;
        Ok(store)
    }

    /// Adds columns that stores made by earlier builds lack.
    fn migrate(&self) -> Result<(), StoreError> {
        for (table, column, decl) in [
            ("runs", "attachments", "TEXT NOT NULL DEFAULT '{}'"),
            ("runs", "owner", "TEXT NOT NULL DEFAULT ''"),
            ("results", "details", "TEXT"),
            // Set when human review first settles a result: the automatic verdict, kept beside the final one.
            ("results", "auto_success", "INTEGER"),
            ("results", "auto_verdict", "TEXT"),
        ] {
            let mut stmt = self
                .conn
                .prepare(&format!("PRAGMA table_info({table})"))
                .map_err(|e| self.err(e))?;
            let names: Vec<String> = stmt
                .query_map([], |r| r.get::<_, String>(1))
                .map_err(|e| self.err(e))?
                .collect::<Result<_, _>>()
                .map_err(|e| self.err(e))?;
            if !names.iter().any(|n| n == column) {
                self.conn
                    .execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
                    .map_err(|e| self.err(e))?;
            }
        }
        Ok(())
    }

    /// Opens an existing store read-only (for `status` and `results` without a coordinator).
    pub fn open_read_only(data_dir: &Path) -> Result<Store, StoreError> {
        let path = data_dir.join(DB_FILE);
        if !path.exists() {
            return Err(StoreError::Missing(path));
        }
        let conn = Connection::open_with_flags(&path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(
            |source| StoreError::Sqlite {
                path: path.clone(),
                source,
            },
        )?;
        let store = Store { conn, path };
        store
            .conn
            .execute_batch("PRAGMA busy_timeout=5000;")
            .map_err(|e| store.err(e))?;
        Ok(store)
    }

    fn err(&self, source: rusqlite::Error) -> StoreError {
        StoreError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// Starts the batch transaction.
    pub fn begin(&self) -> Result<(), StoreError> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| self.err(e))
    }

    /// Commits the batch transaction (fsync'd: synchronous=FULL).
    pub fn commit(&self) -> Result<(), StoreError> {
        self.conn.execute_batch("COMMIT").map_err(|e| self.err(e))
    }

    /// Inserts a run and its tasks, under the task ids `ids` (one per task, in order).
    pub fn insert_run(
        &self,
        run: &LoadedRun,
        sweep_toml: &str,
        attachments_json: &str,
        ids: &[u64],
        tasks: &[NewTask],
    ) -> Result<(), StoreError> {
        assert_eq!(ids.len(), tasks.len(), "one id per task");
        self.conn
            .execute(
                "INSERT INTO runs(run_id, name, sweep_toml, sweep_hash, state, tasks, max_attempts, created_at_ms, attachments, owner) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)",
                params![run.run_id, run.name, sweep_toml, run.sweep_hash, run.state, run.tasks as i64, run.max_attempts, run.created_at_ms, attachments_json, run.owner],
            )
            .map_err(|e| self.err(e))?;
        let mut stmt = self
            .conn
            .prepare_cached(
                "INSERT INTO tasks(task_id, run_id, track, dataset, instance_id, repo_or_app, bug_type, agent, variant, backbone, repeat, kind, affinity_key, payload, ground_truth_actions, state)
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,'pending')",
            )
            .map_err(|e| self.err(e))?;
        for (id, t) in ids.iter().zip(tasks) {
            stmt.execute(params![
                *id as i64,
                run.run_id,
                t.track,
                t.dataset,
                t.instance_id,
                t.repo_or_app,
                t.bug_type,
                t.agent,
                t.variant,
                t.backbone,
                t.repeat,
                t.kind.as_str(),
                t.affinity_key,
                t.payload,
                t.ground_truth_actions
            ])
            .map_err(|e| self.err(e))?;
        }
        Ok(())
    }

    /// Sets a run's state (and finish time).
    pub fn set_run_state(
        &self,
        run_id: &str,
        state: &str,
        finished_at_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.exec(
            "UPDATE runs SET state=?2, finished_at_ms=?3 WHERE run_id=?1",
            params![run_id, state, finished_at_ms],
        )
    }

    /// Records a grant: the task is leased to `node` under `epoch`, and an attempt row opens.
    pub fn record_grant(
        &self,
        task_id: u64,
        epoch: u64,
        node: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "UPDATE tasks SET state='leased', epoch=?2, node_id=?3 WHERE task_id=?1",
            params![task_id as i64, epoch as i64, node],
        )?;
        self.exec(
            "INSERT INTO attempts(task_id, epoch, node_id, granted_at_ms, status) VALUES (?1,?2,?3,?4,'running')",
            params![task_id as i64, epoch as i64, node, now_ms],
        )
    }

    /// Closes an attempt with a status and reason.
    pub fn end_attempt(
        &self,
        task_id: u64,
        epoch: u64,
        status: &str,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "UPDATE attempts SET status=?3, reason=?4, ended_at_ms=?5 WHERE task_id=?1 AND epoch=?2",
            params![task_id as i64, epoch as i64, status, reason, now_ms],
        )
    }

    /// Notes that a result for an old attempt arrived and was refused.
    pub fn mark_late_result(
        &self,
        task_id: u64,
        epoch: u64,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "UPDATE attempts SET late_result_rejected_at_ms=?3 WHERE task_id=?1 AND epoch=?2",
            params![task_id as i64, epoch as i64, now_ms],
        )
    }

    /// Sets a task's state (and infra failure count).
    pub fn set_task_state(
        &self,
        task_id: u64,
        state: &str,
        infra_failures: u32,
    ) -> Result<(), StoreError> {
        self.exec(
            "UPDATE tasks SET state=?2, infra_failures=?3 WHERE task_id=?1",
            params![task_id as i64, state, infra_failures],
        )
    }

    /// Writes a task's result row (at most one per task: the primary key enforces it).
    pub fn insert_result(
        &self,
        task_id: u64,
        run_id: &str,
        epoch: u64,
        r: &ResultRecord,
    ) -> Result<(), StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "INSERT INTO results(task_id, run_id, epoch, success, verdict, error_class, error_message, llm_calls, tokens_in, tokens_out, tokens_cached,
                  cost_usd, wall_s, actions, trace_len, feedback_iterations, localized_files_correct, started_at_ms, finished_at_ms, node_id, artifact_path, details)
                 VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,?18,?19,?20,?21,?22)",
            )
            .map_err(|e| self.err(e))?;
        stmt.execute(params![
            task_id as i64,
            run_id,
            epoch as i64,
            r.success,
            r.verdict,
            r.error_class,
            r.error_message,
            r.llm_calls as i64,
            r.tokens_in as i64,
            r.tokens_out as i64,
            r.tokens_cached as i64,
            r.cost_usd,
            r.wall_s,
            r.actions,
            r.trace_len,
            r.feedback_iterations,
            r.localized_files_correct,
            r.started_at_ms,
            r.finished_at_ms,
            r.node_id,
            r.artifact_path,
            r.details_json
        ])
        .map_err(|e| self.err(e))?;
        Ok(())
    }

    /// Records a node's registration.
    pub fn upsert_node(
        &self,
        node_id: &str,
        hostname: &str,
        slots: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        self.exec(
            "INSERT INTO nodes(node_id, hostname, slots, registered_at_ms) VALUES (?1,?2,?3,?4)
             ON CONFLICT(node_id) DO UPDATE SET hostname=excluded.hostname, slots=excluded.slots, registered_at_ms=excluded.registered_at_ms",
            params![node_id, hostname, slots, now_ms],
        )
    }

    /// What a grant message needs.
    pub fn grant_info(&self, task_id: u64) -> Result<GrantInfo, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT instance_id, variant, payload FROM tasks WHERE task_id=?1")
            .map_err(|e| self.err(e))?;
        stmt.query_row([task_id as i64], |r| {
            Ok(GrantInfo {
                instance_id: r.get(0)?,
                variant: r.get(1)?,
                payload: r.get(2)?,
            })
        })
        .map_err(|e| self.err(e))
    }

    /// All runs, oldest first.
    pub fn load_runs(&self) -> Result<Vec<LoadedRun>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT run_id, name, sweep_hash, state, tasks, max_attempts, created_at_ms, finished_at_ms, owner FROM runs ORDER BY created_at_ms, run_id")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(LoadedRun {
                    run_id: r.get(0)?,
                    name: r.get(1)?,
                    sweep_hash: r.get(2)?,
                    state: r.get(3)?,
                    tasks: r.get::<_, i64>(4)? as u64,
                    max_attempts: r.get(5)?,
                    created_at_ms: r.get(6)?,
                    finished_at_ms: r.get(7)?,
                    owner: r.get(8)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// All tasks of a run (or of every run).
    pub fn load_tasks(&self, run_id: Option<&str>) -> Result<Vec<LoadedTask>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT task_id, run_id, agent, kind, affinity_key, state, epoch, infra_failures, node_id FROM tasks
                 WHERE (?1 IS NULL OR run_id=?1) ORDER BY task_id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok(LoadedTask {
                    task_id: r.get::<_, i64>(0)? as u64,
                    run_id: r.get(1)?,
                    agent: r.get(2)?,
                    kind: r.get(3)?,
                    affinity_key: r.get(4)?,
                    state: r.get(5)?,
                    epoch: r.get::<_, i64>(6)? as u64,
                    infra_failures: r.get(7)?,
                    node_id: r.get(8)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// (affinity key, agent, wall seconds) of every finished task, to seed the estimates.
    pub fn load_durations(&self) -> Result<Vec<(String, String, f64)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT t.affinity_key, t.agent, r.wall_s FROM results r JOIN tasks t ON t.task_id = r.task_id WHERE r.error_class IS NULL")
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Result rows of a run in the results schema, in task order.
    pub fn results(&self, run_id: &str) -> Result<Vec<ResultRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.run_id, u.name, t.track, t.dataset, t.instance_id, t.repo_or_app, t.bug_type, t.agent, t.variant, t.backbone, t.repeat,
                        r.success, r.verdict, r.error_class, r.epoch, r.llm_calls, r.tokens_in, r.tokens_out, r.tokens_cached, r.cost_usd, r.wall_s,
                        r.actions, r.trace_len, t.ground_truth_actions, r.feedback_iterations, r.localized_files_correct,
                        r.started_at_ms, r.finished_at_ms, r.node_id, r.artifact_path, r.details, r.error_message,
                        CASE WHEN json_valid(r.details) THEN json_extract(r.details, '$.rules') END,
                        CASE WHEN json_valid(r.details) THEN json_extract(r.details, '$.coverage_delta_pred') END
                 FROM results r JOIN tasks t ON t.task_id = r.task_id JOIN runs u ON u.run_id = r.run_id
                 WHERE r.run_id = ?1 ORDER BY r.task_id",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok(ResultRow {
                    schema_version: Default::default(),
                    run_id: r.get(0)?,
                    sweep: r.get(1)?,
                    track: r.get(2)?,
                    dataset: r.get(3)?,
                    instance_id: r.get(4)?,
                    repo_or_app: r.get(5)?,
                    bug_type: r.get(6)?,
                    agent: r.get(7)?,
                    variant: r.get(8)?,
                    backbone: r.get(9)?,
                    repeat: r.get(10)?,
                    success: r.get(11)?,
                    verdict: r.get(12)?,
                    error_class: r.get(13)?,
                    error_message: r.get(31)?,
                    rules: r
                        .get::<_, Option<rusqlite::types::Value>>(32)?
                        .and_then(|v| match v {
                            rusqlite::types::Value::Text(t) => Some(t),
                            _ => None,
                        }),
                    coverage_delta: r
                        .get::<_, Option<rusqlite::types::Value>>(33)?
                        .and_then(|v| match v {
                            rusqlite::types::Value::Real(x) => Some(x),
                            rusqlite::types::Value::Integer(i) => Some(i as f64),
                            _ => None,
                        }),
                    attempts: r.get(14)?,
                    llm_calls: r.get::<_, i64>(15)? as u64,
                    tokens_in: r.get::<_, i64>(16)? as u64,
                    tokens_out: r.get::<_, i64>(17)? as u64,
                    tokens_cached: r.get::<_, i64>(18)? as u64,
                    cost_usd: r.get(19)?,
                    wall_s: r.get(20)?,
                    actions: r.get(21)?,
                    trace_len: r.get(22)?,
                    ground_truth_actions: r.get(23)?,
                    feedback_iterations: r.get(24)?,
                    localized_files_correct: r.get(25)?,
                    started_at: rfc3339_ms(r.get(26)?),
                    finished_at: rfc3339_ms(r.get(27)?),
                    node_id: r.get(28)?,
                    artifact_path: r.get(29)?,
                    details_json: r.get::<_, Option<String>>(30)?.unwrap_or_default(),
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Attempts of a run, in task and epoch order.
    pub fn attempts(&self, run_id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT a.task_id, t.instance_id, a.epoch, a.node_id, a.status, a.reason, a.late_result_rejected_at_ms
                 FROM attempts a JOIN tasks t ON t.task_id = a.task_id WHERE t.run_id = ?1 ORDER BY a.task_id, a.epoch",
            )
            .map_err(|e| self.err(e))?;
        let rows = stmt
            .query_map([run_id], |r| {
                Ok(AttemptRow {
                    task_id: r.get::<_, i64>(0)? as u64,
                    instance_id: r.get(1)?,
                    epoch: r.get::<_, i64>(2)? as u64,
                    node_id: r.get(3)?,
                    status: r.get(4)?,
                    reason: r.get(5)?,
                    late_result_rejected_at_ms: r.get(6)?,
                })
            })
            .map_err(|e| self.err(e))?;
        rows.collect::<Result<_, _>>().map_err(|e| self.err(e))
    }

    /// Run summaries computed from the stored task states (used without a live coordinator).
    pub fn run_summaries(&self) -> Result<Vec<RunSummary>, StoreError> {
        let runs = self.load_runs()?;
        let mut stmt = self
            .conn
            .prepare("SELECT run_id, state, COUNT(*) FROM tasks GROUP BY run_id, state")
            .map_err(|e| self.err(e))?;
        let counts: Vec<(String, String, i64)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        let mut retried_stmt = self
            .conn
            .prepare("SELECT t.run_id, COUNT(*) FROM attempts a JOIN tasks t ON t.task_id=a.task_id WHERE a.status NOT IN ('running','finished','cancelled') GROUP BY t.run_id")
            .map_err(|e| self.err(e))?;
        let retried: Vec<(String, i64)> = retried_stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        Ok(runs
            .into_iter()
            .map(|run| {
                let mut s = RunSummary {
                    run_id: run.run_id.clone(),
                    name: run.name,
                    state: RunState::parse(&run.state).unwrap_or_default(),
                    tasks: run.tasks,
                    created_at_ms: run.created_at_ms,
                    finished_at_ms: run.finished_at_ms.unwrap_or(0),
                    ..Default::default()
                };
                for (_, st, n) in counts.iter().filter(|(r, _, _)| *r == run.run_id) {
                    let n = *n as u64;
                    match st.as_str() {
                        state::PENDING => s.pending = n,
                        state::LEASED => s.running = n,
                        state::SUCCEEDED => s.succeeded = n,
                        state::FAILED => s.failed = n,
                        state::ERRORED => s.errored = n,
                        state::CANCELLED => s.cancelled = n,
                        _ => {}
                    }
                }
                s.retried_attempts = retried
                    .iter()
                    .find(|(r, _)| *r == run.run_id)
                    .map_or(0, |(_, n)| *n as u64);
                s
            })
            .collect())
    }

    /// The stored sweep TOML of a run.
    pub fn sweep_toml(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.conn
            .query_row(
                "SELECT sweep_toml FROM runs WHERE run_id=?1",
                [run_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| self.err(e))
    }

    /// The review queue of a run (or the one item of `task_id`), in task order.
    pub fn review_queue(
        &self,
        run_id: &str,
        task_id: Option<u64>,
    ) -> Result<Vec<ReviewItem>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.task_id, t.instance_id, t.agent, t.variant, t.backbone, t.repeat,
                        COALESCE(r.auto_success, r.success), COALESCE(r.auto_verdict, r.verdict), r.success, r.verdict, r.artifact_path
                 FROM results r JOIN tasks t ON t.task_id = r.task_id
                 WHERE r.run_id = ?1 AND (?2 IS NULL OR r.task_id = ?2)
                   AND t.track = 'android' AND t.bug_type = 'non-crash' AND r.error_class IS NULL
                 ORDER BY r.task_id",
            )
            .map_err(|e| self.err(e))?;
        let mut items: Vec<ReviewItem> = stmt
            .query_map(params![run_id, task_id.map(|t| t as i64)], |r| {
                Ok(ReviewItem {
                    task_id: r.get::<_, i64>(0)? as u64,
                    instance_id: r.get(1)?,
                    agent: r.get(2)?,
                    variant: r.get(3)?,
                    backbone: r.get(4)?,
                    repeat: r.get(5)?,
                    auto_success: r.get(6)?,
                    auto_verdict: r.get(7)?,
                    success: r.get(8)?,
                    verdict: r.get(9)?,
                    artifact_path: r.get(10)?,
                    state: ReviewState::Pending,
                    final_verdict: None,
                    reviews: Vec::new(),
                })
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        let mut stmt = self
            .conn
            .prepare(
                "SELECT v.task_id, v.reviewer, v.verdict, v.note FROM reviews v JOIN results r ON r.task_id = v.task_id
                 WHERE r.run_id = ?1 AND (?2 IS NULL OR v.task_id = ?2) ORDER BY v.task_id, v.review_id",
            )
            .map_err(|e| self.err(e))?;
        let reviews: Vec<(u64, String, String, Option<String>)> = stmt
            .query_map(params![run_id, task_id.map(|t| t as i64)], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get(1)?, r.get(2)?, r.get(3)?))
            })
            .map_err(|e| self.err(e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(e))?;
        for (task, reviewer, verdict, note) in reviews {
            if let (Some(item), Some(verdict)) = (
                items.iter_mut().find(|i| i.task_id == task),
                HumanVerdict::parse(&verdict),
            ) {
                item.reviews.push(Review {
                    reviewer,
                    verdict,
                    note,
                });
            }
        }
        for item in &mut items {
            let verdicts: Vec<HumanVerdict> = item.reviews.iter().map(|r| r.verdict).collect();
            item.state = review::review_state(&verdicts);
            item.final_verdict = review::final_verdict(&verdicts);
        }
        Ok(items)
    }

    /// Records a review of one queue item in one transaction; when it settles the item, the
    /// result row takes the final verdict (the automatic one is kept in `auto_success` and
    /// `auto_verdict`). Returns the item as it now stands, or why the review is refused
    /// (nothing is written then).
    pub fn submit_review(
        &self,
        run_id: &str,
        task_id: u64,
        reviewer: &str,
        verdict: HumanVerdict,
        note: Option<&str>,
        now_ms: i64,
    ) -> Result<Result<ReviewItem, Refusal>, StoreError> {
        self.begin()?;
        let outcome = self.submit_review_in_tx(run_id, task_id, reviewer, verdict, note, now_ms);
        let end = match &outcome {
            Ok(Ok(_)) => "COMMIT",
            _ => "ROLLBACK",
        };
        self.conn.execute_batch(end).map_err(|e| self.err(e))?;
        outcome
    }

    fn submit_review_in_tx(
        &self,
        run_id: &str,
        task_id: u64,
        reviewer: &str,
        verdict: HumanVerdict,
        note: Option<&str>,
        now_ms: i64,
    ) -> Result<Result<ReviewItem, Refusal>, StoreError> {
        let Some(item) = self.review_queue(run_id, Some(task_id))?.pop() else {
            return Err(self.err(rusqlite::Error::QueryReturnedNoRows));
        };
        if let Err(refusal) = review::check_submit(&item.reviews, reviewer) {
            return Ok(Err(refusal));
        }
        self.exec(
            "INSERT INTO reviews(task_id, reviewer, verdict, note, created_at_ms) VALUES (?1,?2,?3,?4,?5)",
            params![task_id as i64, reviewer, verdict.as_str(), note, now_ms],
        )?;
        let mut verdicts: Vec<HumanVerdict> = item.reviews.iter().map(|r| r.verdict).collect();
        verdicts.push(verdict);
        if let Some(v) = review::final_verdict(&verdicts) {
            // The right-hand sides read the row as it was: the automatic values are kept once.
            self.exec(
                "UPDATE results SET auto_success = COALESCE(auto_success, success), auto_verdict = COALESCE(auto_verdict, verdict),
                 success = ?2, verdict = ?3 WHERE task_id = ?1",
                params![task_id as i64, v.success(), v.as_str()],
            )?;
        }
        match self.review_queue(run_id, Some(task_id))?.pop() {
            Some(item) => Ok(Ok(item)),
            None => Err(self.err(rusqlite::Error::QueryReturnedNoRows)),
        }
    }

    fn exec(&self, sql: &str, params: impl rusqlite::Params) -> Result<(), StoreError> {
        let mut stmt = self.conn.prepare_cached(sql).map_err(|e| self.err(e))?;
        stmt.execute(params).map_err(|e| self.err(e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(bug_type: &str, agent: &str) -> NewTask {
        NewTask {
            track: "android".into(),
            dataset: "android-sim".into(),
            instance_id: format!("app-{bug_type}"),
            repo_or_app: "app".into(),
            bug_type: Some(bug_type.into()),
            agent: agent.into(),
            variant: "full".into(),
            backbone: "none".into(),
            repeat: 0,
            kind: reprobench_domain::registry::ExecutorKind::Sim,
            affinity_key: "app".into(),
            payload: "{}".into(),
            ground_truth_actions: Some(3),
        }
    }

    #[test]
    fn reviews_settle_results_and_keep_the_automatic_verdict() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let run = LoadedRun {
            run_id: "r1".into(),
            name: "s".into(),
            sweep_hash: "h".into(),
            state: "finished".into(),
            tasks: 2,
            max_attempts: 3,
            created_at_ms: 0,
            finished_at_ms: None,
            owner: String::new(),
        };
        let ids = [1, 2];
        store
            .insert_run(
                &run,
                "",
                "{}",
                &ids,
                &[task("non-crash", "monkey"), task("crash", "monkey")],
            )
            .unwrap();
        for id in &ids {
            let r = ResultRecord {
                verdict: "not_reproduced".into(),
                node_id: "n".into(),
                ..Default::default()
            };
            store.insert_result(*id, "r1", 1, &r).unwrap();
        }
        let queue = store.review_queue("r1", None).unwrap();
        assert_eq!(queue.len(), 1, "crash results are not queued");
        let id = queue[0].task_id;
        let rep = HumanVerdict::Reproduced;
        let item = store
            .submit_review("r1", id, "ann", rep, Some("toast shown"), 1)
            .unwrap()
            .unwrap();
        assert_eq!(item.state, ReviewState::Pending);
        assert!(matches!(
            store.submit_review("r1", id, "ann", rep, None, 2).unwrap(),
            Err(Refusal::AlreadyReviewed { .. })
        ));
        let item = store
            .submit_review("r1", id, "bob", rep, None, 3)
            .unwrap()
            .unwrap();
        assert_eq!(item.state, ReviewState::Agreed);
        assert!(item.changed() && item.success && !item.auto_success);
        assert_eq!(
            (item.verdict.as_str(), item.auto_verdict.as_str()),
            ("reproduced", "not_reproduced")
        );
        let rows = store.results("r1").unwrap();
        assert!(rows[0].success && rows[0].verdict == "reproduced");
        assert!(matches!(
            store.submit_review("r1", id, "cat", rep, None, 4).unwrap(),
            Err(Refusal::AlreadyAgreed(_))
        ));
        // The refused reviews wrote nothing.
        assert_eq!(store.review_queue("r1", None).unwrap()[0].reviews.len(), 2);
    }

    #[test]
    fn an_old_store_gains_the_review_table_and_columns() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
        conn.execute_batch(
            "CREATE TABLE results(task_id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, epoch INTEGER NOT NULL, success INTEGER NOT NULL, verdict TEXT NOT NULL,
              error_class TEXT, error_message TEXT, llm_calls INTEGER NOT NULL, tokens_in INTEGER NOT NULL, tokens_out INTEGER NOT NULL, tokens_cached INTEGER NOT NULL,
              cost_usd REAL NOT NULL, wall_s REAL NOT NULL, actions INTEGER, trace_len INTEGER, feedback_iterations INTEGER, localized_files_correct INTEGER,
              started_at_ms INTEGER NOT NULL, finished_at_ms INTEGER NOT NULL, node_id TEXT NOT NULL, artifact_path TEXT NOT NULL);",
        )
        .unwrap();
        drop(conn);
        let store = Store::open(dir.path()).unwrap();
        assert!(store.review_queue("none", None).unwrap().is_empty());
    }
}
