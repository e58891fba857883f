//! A task's lifecycle as data, apart from the store, the clock and the threads: the one
//! `TaskState × Event` table the core moves every task through ([`next`]), and the fencing rule
//! that decides what a node's result for an attempt is worth ([`judge_result`]).
//!
//! The core ([`crate::core`]) asks these functions and then does what they say, inside its
//! transaction. An illegal transition is an error value here, never a silent change of state.

use crate::store::state;

/// Where a task is in its life. `Pending` and `Leased` are open; the other four are final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskState {
    /// Queued, waiting for a grant.
    Pending,
    /// Granted to a node under a lease.
    Leased,
    /// Finished with a success.
    Succeeded,
    /// Finished without a success.
    Failed,
    /// Ended in an error (the agent's, bad input, or infrastructure past the retry bound).
    Errored,
    /// Its run was cancelled before it finished.
    Cancelled,
}

impl TaskState {
    /// Every state, in table order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Pending,
        TaskState::Leased,
        TaskState::Succeeded,
        TaskState::Failed,
        TaskState::Errored,
        TaskState::Cancelled,
    ];

    /// The state a store column holds (an unknown name reads as pending, to be run again).
    pub fn parse(s: &str) -> TaskState {
        match s {
            state::LEASED => TaskState::Leased,
            state::SUCCEEDED => TaskState::Succeeded,
            state::FAILED => TaskState::Failed,
            state::ERRORED => TaskState::Errored,
            state::CANCELLED => TaskState::Cancelled,
            _ => TaskState::Pending,
        }
    }

    /// The name the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => state::PENDING,
            TaskState::Leased => state::LEASED,
            TaskState::Succeeded => state::SUCCEEDED,
            TaskState::Failed => state::FAILED,
            TaskState::Errored => state::ERRORED,
            TaskState::Cancelled => state::CANCELLED,
        }
    }

    /// Whether nothing more happens to a task in this state.
    pub fn is_final(self) -> bool {
        !matches!(self, TaskState::Pending | TaskState::Leased)
    }
}

/// How an attempt that ran to an outcome ended the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// The outcome is a success.
    Succeeded,
    /// The outcome is not a success and no error.
    Failed,
    /// The outcome is an error that a retry would not change (agent, bad input).
    Errored,
}

/// Something that happens to a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// The scheduler grants it to a node.
    Grant,
    /// Its node delivered the current attempt's outcome.
    Finished(Ending),
    /// Its attempt was lost to the infrastructure (an infra error, an expired lease, a node
    /// gone); `retry` says whether the retry bound leaves another attempt.
    AttemptLost {
        /// Whether another attempt is allowed.
        retry: bool,
    },
    /// Its run was cancelled.
    Cancel,
}

impl Event {
    /// Every event, for tables and tests.
    pub const ALL: [Event; 7] = [
        Event::Grant,
        Event::Finished(Ending::Succeeded),
        Event::Finished(Ending::Failed),
        Event::Finished(Ending::Errored),
        Event::AttemptLost { retry: true },
        Event::AttemptLost { retry: false },
        Event::Cancel,
    ];
}

/// An event that the task's state does not allow: a bug in the caller, refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a {from:?} task cannot take {event:?}")]
pub struct IllegalTransition {
    /// The state the task was in.
    pub from: TaskState,
    /// The event refused.
    pub event: Event,
}

/// The state after `event`, or why `event` cannot happen in `from`.
pub fn next(from: TaskState, event: Event) -> Result<TaskState, IllegalTransition> {
    use TaskState::*;
    let to = match (from, event) {
        (Pending, Event::Grant) => Leased,
        (Leased, Event::Finished(Ending::Succeeded)) => Succeeded,
        (Leased, Event::Finished(Ending::Failed)) => Failed,
        (Leased, Event::Finished(Ending::Errored)) => Errored,
        (Leased, Event::AttemptLost { retry: true }) => Pending,
        (Leased, Event::AttemptLost { retry: false }) => Errored,
        (Pending | Leased, Event::Cancel) => Cancelled,
        _ => return Err(IllegalTransition { from, event }),
    };
    Ok(to)
}

/// The retry rule: after `infra_failures` infrastructure failures (this one included), another
/// attempt is allowed while they stay under the run's `max_attempts`.
pub fn attempt_lost(infra_failures: u32, max_attempts: u32) -> Event {
    Event::AttemptLost {
        retry: infra_failures < max_attempts,
    }
}

/// One attempt: the node that holds (or held) it and its lease epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt<N> {
    /// The node.
    pub node: N,
    /// The lease epoch.
    pub epoch: u64,
}

/// What the core knows of a task when a result for it arrives.
#[derive(Debug, Clone, Copy)]
pub struct ResultContext<N> {
    /// The task's state.
    pub state: TaskState,
    /// The task's latest epoch.
    pub epoch: u64,
    /// The attempt holding the lease now, if any.
    pub lease: Option<Attempt<N>>,
    /// The attempt whose result was recorded, if any.
    pub recorded: Option<Attempt<N>>,
}

/// What a delivered result is worth.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultVerdict {
    /// It is the current attempt's: record it and acknowledge.
    Accept,
    /// It was recorded already (a re-delivery): acknowledge, record nothing.
    Duplicate,
    /// It comes from an attempt that no longer holds the task: refuse it, saying why.
    Refuse(String),
}

/// The fencing rule: only the attempt holding the lease is recorded, once; a re-delivery of the
/// recorded one is acknowledged; anything else (an older epoch, another node, a cancelled run)
/// is refused.
pub fn judge_result<N: PartialEq + Copy>(
    task: &ResultContext<N>,
    from: Attempt<N>,
) -> ResultVerdict {
    if task.lease == Some(from) {
        return ResultVerdict::Accept;
    }
    if task.recorded == Some(from) {
        return ResultVerdict::Duplicate;
    }
    ResultVerdict::Refuse(match task.state {
        TaskState::Cancelled => "the run was cancelled".to_string(),
        _ => format!("stale attempt: the lease passed to attempt {}", task.epoch),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_allows_exactly_the_lifecycle_and_refuses_everything_else() {
        use TaskState::*;
        let legal = [
            (Pending, Event::Grant, Leased),
            (Pending, Event::Cancel, Cancelled),
            (Leased, Event::Finished(Ending::Succeeded), Succeeded),
            (Leased, Event::Finished(Ending::Failed), Failed),
            (Leased, Event::Finished(Ending::Errored), Errored),
            (Leased, Event::AttemptLost { retry: true }, Pending),
            (Leased, Event::AttemptLost { retry: false }, Errored),
            (Leased, Event::Cancel, Cancelled),
        ];
        for from in TaskState::ALL {
            for event in Event::ALL {
                let want = legal
                    .iter()
                    .find(|(f, e, _)| *f == from && *e == event)
                    .map(|(_, _, to)| *to);
                match (next(from, event), want) {
                    (Ok(to), Some(w)) => assert_eq!(to, w, "{from:?} on {event:?}"),
                    (Err(e), None) => assert_eq!(e, IllegalTransition { from, event }),
                    (got, want) => panic!("{from:?} on {event:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn a_final_task_takes_no_event_so_it_has_one_result() {
        for from in TaskState::ALL.into_iter().filter(|s| s.is_final()) {
            for event in Event::ALL {
                assert!(next(from, event).is_err(), "{from:?} took {event:?}");
            }
        }
        // A finished task cannot be granted or finished again: no second result.
        let done = next(TaskState::Leased, Event::Finished(Ending::Succeeded)).unwrap();
        assert!(next(done, Event::Grant).is_err());
        assert!(next(done, Event::Finished(Ending::Failed)).is_err());
    }

    #[test]
    fn infrastructure_failures_retry_up_to_the_bound_then_end_in_an_error() {
        let mut state = TaskState::Pending;
        let max = 3;
        let mut failures = 0;
        let mut grants = 0;
        while !state.is_final() {
            state = next(state, Event::Grant).unwrap();
            grants += 1;
            failures += 1;
            state = next(state, attempt_lost(failures, max)).unwrap();
        }
        assert_eq!((state, grants), (TaskState::Errored, max));
    }

    #[test]
    fn only_the_lease_holder_s_result_counts_and_a_redelivery_is_acknowledged() {
        let a = |node: u32, epoch: u64| Attempt { node, epoch };
        let leased = ResultContext {
            state: TaskState::Leased,
            epoch: 2,
            lease: Some(a(7, 2)),
            recorded: None,
        };
        assert_eq!(judge_result(&leased, a(7, 2)), ResultVerdict::Accept);
        // The attempt before the lease passed on, and the same epoch from another node.
        for stale in [a(7, 1), a(8, 2)] {
            assert_eq!(
                judge_result(&leased, stale),
                ResultVerdict::Refuse("stale attempt: the lease passed to attempt 2".into())
            );
        }
        let recorded = ResultContext {
            state: TaskState::Succeeded,
            epoch: 2,
            lease: None,
            recorded: Some(a(7, 2)),
        };
        assert_eq!(judge_result(&recorded, a(7, 2)), ResultVerdict::Duplicate);
        assert!(matches!(
            judge_result(&recorded, a(7, 1)),
            ResultVerdict::Refuse(_)
        ));
        let cancelled = ResultContext {
            state: TaskState::Cancelled,
            epoch: 1,
            lease: None,
            recorded: None,
        };
        assert_eq!(
            judge_result(&cancelled, a(7, 1)),
            ResultVerdict::Refuse("the run was cancelled".into())
        );
    }
}
