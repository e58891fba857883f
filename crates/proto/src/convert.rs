//! Domain types to and from the wire, the one place both meet: the results schema's rows (the
//! store reads and writes `reprobench_domain::results::ResultRow`; the coordinator's server
//! converts them on the way out, clients on the way in), executors' outcomes and attempt
//! references (`reprobench_domain::outcome`; the node's runtime converts them), and the
//! coordinator's messages ([`messages`]; its server converts them).

use crate::v1::{self, ResultRow as WireRow};
use reprobench_domain::outcome;
use reprobench_domain::results::ResultRow;

/// Moves a row's fields into the other type. Both sides are spelled out in full (the source
/// destructured, the target built without `..`), so a field one side lacks is a compile error
/// here, never a silent drop.
macro_rules! move_fields {
    ($row:expr, $from:ident [$($skip:ident),*] => $to:ident [$($extra:ident: $value:expr),*], [$($field:ident),* $(,)?]) => {{
        let $from { $($field,)* $($skip: _,)* } = $row;
        $to { $($extra: $value,)* $($field,)* }
    }};
}

/// The fields both rows have, by name.
macro_rules! shared_fields {
    ($mac:ident!($($head:tt)*)) => {
        $mac!($($head)*, [
            run_id, sweep, track, dataset, instance_id, repo_or_app, bug_type, agent, variant,
            backbone, repeat, success, verdict, error_class, error_message, rules, coverage_delta,
            attempts, llm_calls, tokens_in, tokens_out, tokens_cached, cost_usd, wall_s, actions,
            trace_len, ground_truth_actions, feedback_iterations, localized_files_correct,
            started_at, finished_at, node_id, artifact_path, details_json,
        ])
    };
}

pub mod messages;

impl From<ResultRow> for WireRow {
    fn from(r: ResultRow) -> WireRow {
        // The wire carries rows of the sender's schema version and has no field for it.
        shared_fields!(move_fields!(r, ResultRow [schema_version] => WireRow []))
    }
}

impl From<WireRow> for ResultRow {
    fn from(r: WireRow) -> ResultRow {
        shared_fields!(
            move_fields!(r, WireRow [] => ResultRow [schema_version: Default::default()])
        )
    }
}

impl From<outcome::FailureClass> for v1::FailureClass {
    fn from(c: outcome::FailureClass) -> v1::FailureClass {
        match c {
            outcome::FailureClass::None => v1::FailureClass::None,
            outcome::FailureClass::Agent => v1::FailureClass::Agent,
            outcome::FailureClass::Infra => v1::FailureClass::Infra,
            outcome::FailureClass::BadInput => v1::FailureClass::BadInput,
        }
    }
}

impl From<v1::FailureClass> for outcome::FailureClass {
    fn from(c: v1::FailureClass) -> outcome::FailureClass {
        match c {
            v1::FailureClass::None => outcome::FailureClass::None,
            v1::FailureClass::Agent => outcome::FailureClass::Agent,
            v1::FailureClass::Infra => outcome::FailureClass::Infra,
            v1::FailureClass::BadInput => outcome::FailureClass::BadInput,
        }
    }
}

/// The failure class a wire value names; a number this build does not know reads as an
/// infrastructure failure (retried), never as a success.
pub fn failure_class(wire: i32) -> outcome::FailureClass {
    v1::FailureClass::try_from(wire).map_or(outcome::FailureClass::Infra, Into::into)
}

impl From<outcome::AttemptRef> for v1::AttemptRef {
    fn from(a: outcome::AttemptRef) -> v1::AttemptRef {
        v1::AttemptRef {
            task_id: a.task_id,
            epoch: a.epoch,
        }
    }
}

impl From<v1::AttemptRef> for outcome::AttemptRef {
    fn from(a: v1::AttemptRef) -> outcome::AttemptRef {
        outcome::AttemptRef {
            task_id: a.task_id,
            epoch: a.epoch,
        }
    }
}

/// The fields both outcomes have, by name (the failure class is typed on one side only).
macro_rules! outcome_fields {
    ($mac:ident!($($head:tt)*)) => {
        $mac!($($head)*, [
            success, verdict, error_class, error_message, llm_calls, tokens_in, tokens_out,
            tokens_cached, cost_usd, wall_s, actions, trace_len, feedback_iterations,
            localized_files_correct, started_at_ms, finished_at_ms, artifact_path, details_json,
        ])
    };
}

impl From<outcome::Outcome> for v1::Outcome {
    fn from(o: outcome::Outcome) -> v1::Outcome {
        use outcome::Outcome as DomainOutcome;
        use v1::Outcome as WireOutcome;
        let class = v1::FailureClass::from(o.failure_class) as i32;
        outcome_fields!(
            move_fields!(o, DomainOutcome [failure_class] => WireOutcome [failure_class: class])
        )
    }
}

impl From<v1::Outcome> for outcome::Outcome {
    fn from(o: v1::Outcome) -> outcome::Outcome {
        use outcome::Outcome as DomainOutcome;
        use v1::Outcome as WireOutcome;
        let class = failure_class(o.failure_class);
        outcome_fields!(
            move_fields!(o, WireOutcome [failure_class] => DomainOutcome [failure_class: class])
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_crosses_the_wire_and_back_unchanged() {
        let row = ResultRow {
            run_id: "run-1".into(),
            sweep: "s".into(),
            track: "swt".into(),
            dataset: "d".into(),
            instance_id: "i".into(),
            repo_or_app: "o/r".into(),
            bug_type: Some("crash".into()),
            agent: "gold".into(),
            variant: "default".into(),
            backbone: "none".into(),
            repeat: 2,
            success: true,
            verdict: "resolved".into(),
            error_class: Some("e".into()),
            error_message: Some("why".into()),
            rules: Some("swt-bench-2024".into()),
            coverage_delta: Some(0.5),
            attempts: 3,
            llm_calls: 4,
            tokens_in: 5,
            tokens_out: 6,
            tokens_cached: 7,
            cost_usd: 0.25,
            wall_s: 1.5,
            actions: Some(8),
            trace_len: Some(9),
            ground_truth_actions: Some(10),
            feedback_iterations: Some(11),
            localized_files_correct: Some(false),
            started_at: "2026-12-06T00:00:00.000Z".into(),
            finished_at: "2026-12-06T00:00:01.000Z".into(),
            node_id: "n".into(),
            artifact_path: "/a".into(),
            details_json: "{}".into(),
            ..Default::default()
        };
        let wire = WireRow::from(row.clone());
        assert_eq!(wire.coverage_delta, Some(0.5));
        assert_eq!(ResultRow::from(wire), row);
    }

    #[test]
    fn an_outcome_crosses_the_wire_and_back_unchanged_and_an_unknown_class_is_retried() {
        for class in [
            outcome::FailureClass::None,
            outcome::FailureClass::Agent,
            outcome::FailureClass::Infra,
            outcome::FailureClass::BadInput,
        ] {
            let o = outcome::Outcome {
                success: class == outcome::FailureClass::None,
                verdict: "v".into(),
                failure_class: class,
                error_class: "e".into(),
                actions: Some(3),
                localized_files_correct: Some(true),
                started_at_ms: 5,
                details_json: "{}".into(),
                ..Default::default()
            };
            assert_eq!(outcome::Outcome::from(v1::Outcome::from(o.clone())), o);
        }
        assert_eq!(failure_class(99), outcome::FailureClass::Infra);
        let a = outcome::AttemptRef {
            task_id: 7,
            epoch: 2,
        };
        assert_eq!(outcome::AttemptRef::from(v1::AttemptRef::from(a)), a);
    }
}
