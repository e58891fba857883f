//! The one executor trait every kind implements (synthetic, SWT in a sandbox, the Android
//! `sim` and `emulator`), and the attempt types the node runtime hands it. Everything here is
//! a domain type: the node's runtime alone converts to and from the wire.

pub use reprobench_domain::outcome::{AttemptRef, FailureClass, Outcome};
pub use reprobench_domain::registry::ExecutorKind;
use std::future::Future;
use std::pin::Pin;
use tokio_util::sync::CancellationToken;

/// A boxed future, so executors of different kinds sit behind one trait object.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What an executor is asked to run: one attempt of one task.
#[derive(Debug, Clone)]
pub struct AttemptSpec {
    /// Task and lease epoch.
    pub attempt: AttemptRef,
    /// Run id.
    pub run_id: String,
    /// Agent name.
    pub agent: String,
    /// Variant name.
    pub variant: String,
    /// Instance id.
    pub instance_id: String,
    /// Affinity key (environment the attempt needs warm).
    pub affinity_key: String,
    /// Executor-specific description of the task (JSON).
    pub payload_json: String,
    /// 1-based count of grants of this task.
    pub attempt_number: u32,
}

/// What an attempt can use while it runs.
#[derive(Clone)]
pub struct AttemptContext {
    /// Fires when the attempt must stop (lease lost, run cancelled, node draining).
    pub cancel: CancellationToken,
    /// Progress reports (fraction done, message) forwarded to the coordinator.
    pub progress: tokio::sync::mpsc::UnboundedSender<(AttemptRef, f64, String)>,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // one per attempt, moved once: boxing buys nothing
pub enum AttemptEnd {
    /// The attempt ran to an outcome (which may itself be a failure or an error).
    Finished(Outcome),
    /// The attempt stopped because it was cancelled; nothing to report.
    Cancelled,
}

/// Runs attempts of one executor kind.
pub trait Executor: Send + Sync {
    /// The kind this executor serves.
    fn kind(&self) -> ExecutorKind;
    /// Runs one attempt to its end. Must return promptly after `ctx.cancel` fires.
    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd>;
    /// With each grant of this kind, the coordinator's hint of the node's next task: the
    /// description of the task it will most likely be granted next (`None`: none is named, and
    /// an earlier hint is void). The executor may prepare what that task's first step needs
    /// while the current attempts run, as long as a wrong hint costs nothing but that work
    /// (nothing by default).
    fn upcoming(&self, _payload_json: Option<String>) {}
    /// Finishes what attempts left for later (nothing by default), before the node stops.
    fn settle(&self) -> BoxFuture<()> {
        Box::pin(async {})
    }
}

/// An attempt that ended in an error of `class` (infra errors are retried, bad input is not).
pub fn error_end(class: FailureClass, error_class: &str, message: String) -> AttemptEnd {
    AttemptEnd::Finished(Outcome {
        success: false,
        verdict: "error".into(),
        failure_class: class,
        error_class: error_class.into(),
        error_message: message,
        ..Default::default()
    })
}

/// An outcome for input the executor cannot use: final, not retried.
pub fn bad_input(error_class: &str, message: String) -> Outcome {
    Outcome {
        success: false,
        verdict: "error".into(),
        failure_class: FailureClass::BadInput,
        error_class: error_class.into(),
        error_message: message,
        ..Default::default()
    }
}
