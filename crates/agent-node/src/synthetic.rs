//! The `synthetic` executor: sleeps for the task's seeded duration and succeeds with its seeded
//! probability. It runs no agent and no model; it exists to exercise and benchmark the cluster.

use reprobench_domain::outcome::{FailureClass, Outcome};
use reprobench_domain::registry::ExecutorKind;
use reprobench_domain::synthetic::SyntheticPayload;
use reprobench_domain::time::now_ms;
use reprobench_executor::{
    AttemptContext, AttemptEnd, AttemptSpec, BoxFuture, Executor, bad_input,
};
use std::time::{Duration, Instant};

/// Verdict of a synthetic task that drew success.
pub const VERDICT_PASS: &str = "synthetic-pass";
/// Verdict of a synthetic task that drew failure.
pub const VERDICT_FAIL: &str = "synthetic-fail";

/// The synthetic executor.
#[derive(Debug, Default, Clone, Copy)]
pub struct SyntheticExecutor;

impl Executor for SyntheticExecutor {
    fn kind(&self) -> ExecutorKind {
        ExecutorKind::Synthetic
    }

    fn run(&self, spec: AttemptSpec, ctx: AttemptContext) -> BoxFuture<AttemptEnd> {
        Box::pin(async move {
            let payload: SyntheticPayload = match serde_json::from_str(&spec.payload_json) {
                Ok(p) => p,
                Err(e) => {
                    let msg = format!(
                        "task {} has no valid synthetic payload: {e}",
                        spec.instance_id
                    );
                    return AttemptEnd::Finished(bad_input("bad_payload", msg));
                }
            };
            let started_at_ms = now_ms();
            let start = Instant::now();
            let sleep = tokio::time::sleep(Duration::from_millis(payload.duration_ms));
            tokio::select! {
                // Biased: work that is already done is reported, even if a cancel arrived with it.
                biased;
                _ = sleep => {}
                _ = ctx.cancel.cancelled() => return AttemptEnd::Cancelled,
            }
            let success = payload.succeeds();
            AttemptEnd::Finished(Outcome {
                success,
                verdict: if success { VERDICT_PASS } else { VERDICT_FAIL }.into(),
                failure_class: FailureClass::None,
                wall_s: start.elapsed().as_secs_f64(),
                started_at_ms,
                finished_at_ms: now_ms(),
                ..Default::default()
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_domain::outcome::AttemptRef;
    use tokio_util::sync::CancellationToken;

    fn spec(payload: &str) -> AttemptSpec {
        AttemptSpec {
            attempt: AttemptRef {
                task_id: 1,
                epoch: 1,
            },
            run_id: "r".into(),
            agent: "synthetic".into(),
            variant: "full".into(),
            instance_id: "synthetic-00001".into(),
            affinity_key: "k".into(),
            payload_json: payload.into(),
            attempt_number: 1,
        }
    }

    fn ctx() -> AttemptContext {
        let (progress, _) = tokio::sync::mpsc::unbounded_channel();
        AttemptContext {
            cancel: CancellationToken::new(),
            progress,
        }
    }

    #[tokio::test]
    async fn finishes_with_the_seeded_verdict() {
        let p = SyntheticPayload {
            duration_ms: 5,
            success_probability: 1.0,
            seed: 9,
        };
        let end = SyntheticExecutor
            .run(spec(&serde_json::to_string(&p).unwrap()), ctx())
            .await;
        let AttemptEnd::Finished(o) = end else {
            panic!("cancelled")
        };
        assert!(o.success);
        assert_eq!(o.verdict, VERDICT_PASS);
        assert!(o.wall_s >= 0.005);
    }

    #[tokio::test]
    async fn bad_payload_is_bad_input_and_cancel_stops_it() {
        let AttemptEnd::Finished(o) = SyntheticExecutor.run(spec("{"), ctx()).await else {
            panic!()
        };
        assert_eq!(o.failure_class, FailureClass::BadInput);
        let c = ctx();
        c.cancel.cancel();
        let p = SyntheticPayload {
            duration_ms: 60_000,
            success_probability: 1.0,
            seed: 9,
        };
        let end = SyntheticExecutor
            .run(spec(&serde_json::to_string(&p).unwrap()), c)
            .await;
        assert!(matches!(end, AttemptEnd::Cancelled));
    }
}
