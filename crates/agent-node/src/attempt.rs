//! An attempt's life on a node as data, apart from the connection, the clock and the tasks: the
//! one `AttemptState × AttemptEvent` table the runtime moves every granted attempt through
//! ([`next`]), and what each step asks the runtime to do ([`Action`]).
//!
//! granted → running → stopping {revoked, lease lost, handed back} → unacked → acked, or
//! → released when a stopped attempt ends with nothing to report. The runtime
//! ([`crate::runtime`]) owns the executors, the slots and the connection; it asks [`next`] and
//! then does what the step says. An event a state does not take is an error value here, never a
//! silent change of state.

/// Why a running attempt is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StopCause {
    /// The coordinator revoked or cancelled it; it stops without a word.
    Revoked,
    /// Its lease ran out on the node's clock without a renewal: the coordinator may have given it
    /// to another node, so it stops without a word.
    LeaseLost,
    /// The node is draining past its deadline: it stops and tells the coordinator, which queues
    /// the task again at once.
    HandedBack,
}

/// Where a granted attempt is on this node. `Acked` and `Released` are final: the runtime forgets
/// the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptState {
    /// The grant took a slot; the execution has not started.
    Granted,
    /// Its executor is running it.
    Running,
    /// Its executor was told to stop and has not returned yet.
    Stopping(StopCause),
    /// It ended with an outcome, sent to the coordinator and kept until acknowledged (resent on
    /// every reconnection).
    Unacked,
    /// The coordinator acknowledged its result.
    Acked,
    /// It stopped with nothing to report; its slot is free.
    Released,
}

impl AttemptState {
    /// Every state, in table order.
    pub const ALL: [AttemptState; 8] = [
        AttemptState::Granted,
        AttemptState::Running,
        AttemptState::Stopping(StopCause::Revoked),
        AttemptState::Stopping(StopCause::LeaseLost),
        AttemptState::Stopping(StopCause::HandedBack),
        AttemptState::Unacked,
        AttemptState::Acked,
        AttemptState::Released,
    ];

    /// Whether nothing more happens to an attempt in this state.
    pub fn is_final(self) -> bool {
        matches!(self, AttemptState::Acked | AttemptState::Released)
    }

    /// Whether the attempt still holds its slot (its execution has not returned).
    pub fn holds_slot(self) -> bool {
        matches!(
            self,
            AttemptState::Granted | AttemptState::Running | AttemptState::Stopping(_)
        )
    }
}

/// Something that happens to an attempt on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptEvent {
    /// Its execution was spawned.
    Started,
    /// The coordinator revoked or cancelled it.
    Revoked,
    /// Its lease passed on the node's clock without a renewal.
    LeaseExpired,
    /// The node's drain deadline passed while it ran.
    HandBack,
    /// Its execution returned an outcome.
    Finished,
    /// Its execution returned without an outcome, after a stop.
    Cancelled,
    /// The coordinator acknowledged its result.
    Acked,
}

impl AttemptEvent {
    /// Every event, in table order.
    pub const ALL: [AttemptEvent; 7] = [
        AttemptEvent::Started,
        AttemptEvent::Revoked,
        AttemptEvent::LeaseExpired,
        AttemptEvent::HandBack,
        AttemptEvent::Finished,
        AttemptEvent::Cancelled,
        AttemptEvent::Acked,
    ];
}

/// What the runtime does for a step, in the order given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Fire the attempt's cancellation token.
    Cancel,
    /// Send the attempt's result to the coordinator (and keep it until acknowledged).
    SendResult,
    /// Tell the coordinator the attempt was handed back, so it queues the task again.
    SendHandBack,
    /// Free the attempt's slot (and credit it to the coordinator unless draining).
    FreeSlot,
}

/// Where an event takes an attempt, and what the runtime does for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The attempt's next state.
    pub to: AttemptState,
    /// What to do, in order.
    pub actions: &'static [Action],
}

/// An event the attempt's state does not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an attempt in state {from:?} cannot take {event:?}")]
pub struct IllegalTransition {
    /// The attempt's state.
    pub from: AttemptState,
    /// The event it was given.
    pub event: AttemptEvent,
}

/// The lifecycle table: where `event` takes an attempt in state `from`.
pub fn next(from: AttemptState, event: AttemptEvent) -> Result<Step, IllegalTransition> {
    use Action::*;
    use AttemptEvent as E;
    use AttemptState as S;
    use StopCause::*;
    let step = |to: AttemptState, actions: &'static [Action]| Ok(Step { to, actions });
    match (from, event) {
        (S::Granted, E::Started) => step(S::Running, &[]),
        (S::Running, E::Revoked) => step(S::Stopping(Revoked), &[Cancel]),
        (S::Running, E::LeaseExpired) => step(S::Stopping(LeaseLost), &[Cancel]),
        (S::Running, E::HandBack) => step(S::Stopping(HandedBack), &[Cancel]),
        // Already told to stop: a drain deadline still hands it back, so the coordinator
        // requeues it at once instead of waiting for the lease to pass.
        (S::Stopping(Revoked | LeaseLost), E::HandBack) => step(S::Stopping(HandedBack), &[]),
        (S::Stopping(cause), E::Revoked | E::LeaseExpired | E::HandBack) => {
            step(S::Stopping(cause), &[])
        }
        // An outcome is delivered even if it came after a stop: the coordinator's fencing decides
        // whether it still counts.
        (S::Running | S::Stopping(_), E::Finished) => step(S::Unacked, &[SendResult, FreeSlot]),
        (S::Stopping(HandedBack), E::Cancelled) => step(S::Released, &[SendHandBack, FreeSlot]),
        (S::Stopping(Revoked | LeaseLost), E::Cancelled) => step(S::Released, &[FreeSlot]),
        // An executor that returns without an outcome unasked: the slot is freed, and the
        // coordinator reruns the task once the attempt is missing from the heartbeats.
        (S::Running, E::Cancelled) => step(S::Released, &[FreeSlot]),
        // A stop that crossed the result on the wire changes nothing: the result stands.
        (S::Unacked, E::Revoked | E::LeaseExpired | E::HandBack) => step(S::Unacked, &[]),
        (S::Unacked, E::Acked) => step(S::Acked, &[]),
        (from, event) => Err(IllegalTransition { from, event }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Action::*;
    use AttemptEvent as E;
    use AttemptState as S;
    use StopCause::*;

    #[test]
    fn the_table_allows_exactly_the_lifecycle_and_refuses_everything_else() {
        type Row = (AttemptState, AttemptEvent, AttemptState, &'static [Action]);
        let row =
            |from, event, to, actions: &'static [Action]| -> Row { (from, event, to, actions) };
        let mut legal = vec![
            row(S::Granted, E::Started, S::Running, &[]),
            row(S::Running, E::Revoked, S::Stopping(Revoked), &[Cancel]),
            row(
                S::Running,
                E::LeaseExpired,
                S::Stopping(LeaseLost),
                &[Cancel],
            ),
            row(S::Running, E::HandBack, S::Stopping(HandedBack), &[Cancel]),
            row(S::Running, E::Finished, S::Unacked, &[SendResult, FreeSlot]),
            row(S::Running, E::Cancelled, S::Released, &[FreeSlot]),
            row(
                S::Stopping(Revoked),
                E::HandBack,
                S::Stopping(HandedBack),
                &[],
            ),
            row(
                S::Stopping(LeaseLost),
                E::HandBack,
                S::Stopping(HandedBack),
                &[],
            ),
            row(
                S::Stopping(HandedBack),
                E::HandBack,
                S::Stopping(HandedBack),
                &[],
            ),
            row(S::Stopping(Revoked), E::Cancelled, S::Released, &[FreeSlot]),
            row(
                S::Stopping(LeaseLost),
                E::Cancelled,
                S::Released,
                &[FreeSlot],
            ),
            row(
                S::Stopping(HandedBack),
                E::Cancelled,
                S::Released,
                &[SendHandBack, FreeSlot],
            ),
            row(S::Unacked, E::Revoked, S::Unacked, &[]),
            row(S::Unacked, E::LeaseExpired, S::Unacked, &[]),
            row(S::Unacked, E::HandBack, S::Unacked, &[]),
            row(S::Unacked, E::Acked, S::Acked, &[]),
        ];
        for cause in [Revoked, LeaseLost, HandedBack] {
            legal.push(row(S::Stopping(cause), E::Revoked, S::Stopping(cause), &[]));
            legal.push(row(
                S::Stopping(cause),
                E::LeaseExpired,
                S::Stopping(cause),
                &[],
            ));
            legal.push(row(
                S::Stopping(cause),
                E::Finished,
                S::Unacked,
                &[SendResult, FreeSlot],
            ));
        }
        for from in AttemptState::ALL {
            for event in AttemptEvent::ALL {
                let want = legal
                    .iter()
                    .find(|(f, e, _, _)| *f == from && *e == event)
                    .map(|(_, _, to, actions)| Step { to: *to, actions });
                match (next(from, event), want) {
                    (Ok(got), Some(w)) => assert_eq!(got, w, "{from:?} on {event:?}"),
                    (Err(e), None) => assert_eq!(e, IllegalTransition { from, event }),
                    (got, want) => panic!("{from:?} on {event:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn a_final_attempt_takes_no_event_and_every_ending_frees_the_slot_once() {
        for from in AttemptState::ALL.into_iter().filter(|s| s.is_final()) {
            for event in AttemptEvent::ALL {
                assert!(next(from, event).is_err(), "{from:?} took {event:?}");
            }
        }
        // Every path from a grant to a final state frees the slot exactly once and sends at most
        // one message about the attempt's end.
        let mut paths = vec![(S::Granted, 0usize, 0usize, Vec::new())];
        let mut finished = 0;
        while let Some((state, freed, told, path)) = paths.pop() {
            if state.is_final() {
                assert_eq!(freed, 1, "path {path:?}");
                assert!(told <= 1, "path {path:?}");
                assert!(!state.holds_slot());
                finished += 1;
                continue;
            }
            assert!(path.len() < 8, "a cycle: {path:?}");
            for event in AttemptEvent::ALL {
                let Ok(step) = next(state, event) else {
                    continue;
                };
                if step.to == state {
                    assert!(
                        step.actions.is_empty(),
                        "{state:?} on {event:?} repeats work"
                    );
                    continue;
                }
                let frees = step.actions.iter().filter(|a| **a == FreeSlot).count();
                let tells = step
                    .actions
                    .iter()
                    .filter(|a| matches!(a, SendResult | SendHandBack))
                    .count();
                assert_eq!(frees > 0, state.holds_slot() && !step.to.holds_slot());
                let mut path = path.clone();
                path.push(event);
                paths.push((step.to, freed + frees, told + tells, path));
            }
        }
        assert!(finished > 5, "the walk reached {finished} endings");
    }

    #[test]
    fn a_drain_hands_back_what_is_running_and_keeps_what_finished() {
        // Running at the drain deadline: stopped, then handed back when the executor returns.
        let s = next(S::Running, E::HandBack).unwrap();
        assert_eq!(s.actions, &[Cancel]);
        let s = next(s.to, E::Cancelled).unwrap();
        assert_eq!(
            (s.to, s.actions),
            (S::Released, &[SendHandBack, FreeSlot][..])
        );
        // Finished before the deadline: the result waits for its ack; the drain changes nothing.
        let s = next(S::Unacked, E::HandBack).unwrap();
        assert_eq!((s.to, s.actions), (S::Unacked, &[][..]));
        // A revoked attempt the drain reaches is handed back too, without a second cancel.
        let s = next(S::Stopping(Revoked), E::HandBack).unwrap();
        assert_eq!(s.actions, &[] as &[Action]);
        assert_eq!(
            next(s.to, E::Cancelled).unwrap().actions,
            &[SendHandBack, FreeSlot]
        );
    }
}
