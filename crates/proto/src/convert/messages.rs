//! The messages of nodes, the coordinator and users (`reprobench_domain::messages`) to and from
//! the wire. What comes in from the wire is checked here: an executor kind this build does not
//! know refuses a registration, and is dropped from a hello or a credit (no slot of it was
//! registered, so no task of it could be granted).

use crate::v1::{self, coordinator_message, node_message};
use reprobench_domain::messages::{
    CoordinatorMessage, Grant, Hello, NodeMessage, NodeProgress, Registered, Registration, RunList,
    RunProgress, RunState, RunSummary, SlotCount, SubmitRun, Submitted,
};
use reprobench_domain::outcome::AttemptRef;
use reprobench_domain::registry::ExecutorKind;
use v1::{
    NodeProgress as WireProgress, RegisterResponse as WireRegistered, RunSummary as WireSummary,
    SubmitRunRequest as WireSubmit, SubmitRunResponse as WireSubmitted,
};

/// A wire attempt reference; a missing one reads as task 0, which no coordinator has.
fn attempt(a: Option<v1::AttemptRef>) -> AttemptRef {
    a.map(Into::into).unwrap_or_default()
}

fn attempts(list: Vec<v1::AttemptRef>) -> Vec<AttemptRef> {
    list.into_iter().map(Into::into).collect()
}

/// The slots a wire count names, or why not: its kind is unknown to this build.
pub fn slot_count(s: v1::SlotCount) -> Result<SlotCount, String> {
    match ExecutorKind::parse(&s.kind) {
        Some(kind) => Ok(SlotCount {
            kind,
            slots: s.slots,
        }),
        None => Err(format!(
            "unknown executor kind `{}`; this coordinator knows {}: run the same reprobench release on the coordinator and its nodes",
            s.kind,
            ExecutorKind::names()
        )),
    }
}

impl From<SlotCount> for v1::SlotCount {
    fn from(s: SlotCount) -> v1::SlotCount {
        v1::SlotCount {
            kind: s.kind.as_str().to_string(),
            slots: s.slots,
        }
    }
}

impl TryFrom<v1::RegisterRequest> for Registration {
    type Error = String;

    /// Refused when a slot's kind is unknown (the message says which and what to do).
    fn try_from(r: v1::RegisterRequest) -> Result<Registration, String> {
        // The version is the receiver's to check, before converting.
        let v1::RegisterRequest {
            protocol_version: _,
            node_id,
            hostname,
            slots,
            binary_version,
            session,
        } = r;
        let slots = slots
            .into_iter()
            .map(slot_count)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("node `{node_id}` offers slots of an {e}"))?;
        Ok(Registration {
            node_id,
            hostname,
            slots,
            binary_version,
            session,
        })
    }
}

impl From<Registered> for v1::RegisterResponse {
    fn from(r: Registered) -> v1::RegisterResponse {
        move_fields!(r, Registered [] => WireRegistered [protocol_version: crate::PROTOCOL_VERSION], [node_id, lease_ms, heartbeat_ms])
    }
}

impl From<v1::Hello> for Hello {
    fn from(h: v1::Hello) -> Hello {
        let v1::Hello {
            node_id,
            running,
            free,
            warm_keys,
            draining,
            session,
        } = h;
        Hello {
            node_id,
            running: attempts(running),
            free: free
                .into_iter()
                .filter_map(|s| slot_count(s).ok())
                .collect(),
            warm_keys,
            draining,
            session,
        }
    }
}

/// A node's message as the coordinator takes it; `None` for a credit of a kind this build does
/// not know.
pub fn node_message(body: node_message::Body) -> Option<NodeMessage> {
    use node_message::Body;
    Some(match body {
        Body::Hello(h) => NodeMessage::Hello(h.into()),
        Body::Heartbeat(h) => NodeMessage::Heartbeat {
            running: attempts(h.running),
        },
        Body::Credit(c) => NodeMessage::Credit(
            slot_count(v1::SlotCount {
                kind: c.kind,
                slots: c.slots,
            })
            .ok()?,
        ),
        Body::Progress(p) => NodeMessage::Progress {
            attempt: attempt(p.attempt),
            message: p.message,
            fraction: p.fraction,
        },
        Body::Result(r) => NodeMessage::Result {
            attempt: attempt(r.attempt),
            outcome: r.outcome.map(Into::into).unwrap_or_default(),
        },
        Body::HandBack(h) => NodeMessage::HandBack {
            attempt: attempt(h.attempt),
            reason: h.reason,
        },
        Body::Draining(_) => NodeMessage::Draining,
    })
}

impl From<Grant> for v1::Grant {
    fn from(g: Grant) -> v1::Grant {
        let Grant {
            attempt,
            run_id,
            kind,
            affinity_key,
            agent,
            variant,
            instance_id,
            payload_json,
            lease_ms,
            attempt_number,
            upcoming,
        } = g;
        v1::Grant {
            attempt: Some(attempt.into()),
            run_id,
            kind: kind.as_str().to_string(),
            affinity_key,
            agent,
            variant,
            instance_id,
            payload_json,
            lease_ms,
            attempt_number,
            upcoming: upcoming.map(|u| v1::Upcoming {
                task_id: u.task_id,
                payload_json: u.payload_json,
            }),
        }
    }
}

impl From<CoordinatorMessage> for v1::CoordinatorMessage {
    fn from(m: CoordinatorMessage) -> v1::CoordinatorMessage {
        use coordinator_message::Body;
        let stop = |attempt: AttemptRef, reason| v1::Revoke {
            attempt: Some(attempt.into()),
            reason,
        };
        let body = match m {
            CoordinatorMessage::Grant(g) => Body::Grant(g.into()),
            CoordinatorMessage::Renewal { renewed, lease_ms } => Body::Renewal(v1::LeaseRenewal {
                renewed: renewed.into_iter().map(Into::into).collect(),
                lease_ms,
            }),
            CoordinatorMessage::Revoke { attempt, reason } => Body::Revoke(stop(attempt, reason)),
            CoordinatorMessage::Cancel { attempt, reason } => Body::Cancel(stop(attempt, reason)),
            CoordinatorMessage::ResultAck {
                attempt,
                accepted,
                reason,
            } => Body::ResultAck(v1::ResultAck {
                attempt: Some(attempt.into()),
                accepted,
                reason,
            }),
            CoordinatorMessage::Drain { reason } => Body::Drain(v1::Drain { reason }),
            CoordinatorMessage::DrainingAck => Body::DrainingAck(v1::DrainingAck {}),
        };
        v1::CoordinatorMessage { body: Some(body) }
    }
}

impl From<v1::SubmitRunRequest> for SubmitRun {
    fn from(r: v1::SubmitRunRequest) -> SubmitRun {
        move_fields!(r, WireSubmit [] => SubmitRun [], [sweep_toml, resume_existing, attachments, reuse_finished])
    }
}

impl From<Submitted> for v1::SubmitRunResponse {
    fn from(s: Submitted) -> v1::SubmitRunResponse {
        move_fields!(s, Submitted [] => WireSubmitted [], [run_id, tasks, resumed])
    }
}

/// The fields both run summaries have, by name (the state and the kinds are typed on one side).
macro_rules! summary_fields {
    ($mac:ident!($($head:tt)*)) => {
        $mac!($($head)*, [
            run_id, name, tasks, pending, running, succeeded, failed, errored, cancelled,
            created_at_ms, finished_at_ms, retried_attempts,
        ])
    };
}

impl From<RunSummary> for v1::RunSummary {
    fn from(s: RunSummary) -> v1::RunSummary {
        let state = s.state.as_str().to_string();
        let unserved_kinds = s
            .unserved_kinds
            .iter()
            .map(|k| k.as_str().to_string())
            .collect();
        summary_fields!(
            move_fields!(s, RunSummary [state, unserved_kinds] => WireSummary [state: state, unserved_kinds: unserved_kinds])
        )
    }
}

impl From<v1::RunSummary> for RunSummary {
    /// A state this build does not know reads as running (the run is not over for it); a kind it
    /// does not know is left out.
    fn from(s: v1::RunSummary) -> RunSummary {
        let state = RunState::parse(&s.state).unwrap_or_default();
        let unserved_kinds = s
            .unserved_kinds
            .iter()
            .filter_map(|k| ExecutorKind::parse(k))
            .collect();
        summary_fields!(
            move_fields!(s, WireSummary [state, unserved_kinds] => RunSummary [state: state, unserved_kinds: unserved_kinds])
        )
    }
}

/// The fields of a node's progress, the same on both sides.
macro_rules! node_progress_fields {
    ($mac:ident!($($head:tt)*)) => {
        $mac!($($head)*, [node_id, live, running, finished, slots])
    };
}

impl From<NodeProgress> for v1::NodeProgress {
    fn from(n: NodeProgress) -> v1::NodeProgress {
        node_progress_fields!(move_fields!(n, NodeProgress [] => WireProgress []))
    }
}

impl From<v1::NodeProgress> for NodeProgress {
    fn from(n: v1::NodeProgress) -> NodeProgress {
        node_progress_fields!(move_fields!(n, WireProgress [] => NodeProgress []))
    }
}

impl From<RunProgress> for v1::RunProgress {
    fn from(p: RunProgress) -> v1::RunProgress {
        v1::RunProgress {
            run: Some(p.run.into()),
            nodes: p.nodes.into_iter().map(Into::into).collect(),
            // The wire says "unknown" with a negative number.
            eta_s: p.eta_s.unwrap_or(-1.0),
        }
    }
}

impl From<v1::RunProgress> for RunProgress {
    fn from(p: v1::RunProgress) -> RunProgress {
        RunProgress {
            run: p.run.map(Into::into).unwrap_or_default(),
            nodes: p.nodes.into_iter().map(Into::into).collect(),
            eta_s: (p.eta_s >= 0.0).then_some(p.eta_s),
        }
    }
}

impl From<RunList> for v1::ListRunsResponse {
    fn from(l: RunList) -> v1::ListRunsResponse {
        v1::ListRunsResponse {
            runs: l.runs.into_iter().map(Into::into).collect(),
            live_nodes: l.live_nodes,
        }
    }
}

impl From<v1::ListRunsResponse> for RunList {
    fn from(l: v1::ListRunsResponse) -> RunList {
        RunList {
            runs: l.runs.into_iter().map(Into::into).collect(),
            live_nodes: l.live_nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_slot(kind: &str, slots: u32) -> v1::SlotCount {
        v1::SlotCount {
            kind: kind.into(),
            slots,
        }
    }

    #[test]
    fn a_registration_with_a_kind_this_build_does_not_know_is_refused_naming_it() {
        let req = v1::RegisterRequest {
            node_id: "n1".into(),
            slots: vec![wire_slot("docker", 2), wire_slot("gpu", 1)],
            ..Default::default()
        };
        let err = Registration::try_from(req.clone()).unwrap_err();
        assert!(err.contains("`n1`") && err.contains("`gpu`") && err.contains("docker, process"));
        let ok = v1::RegisterRequest {
            slots: vec![wire_slot("docker", 2), wire_slot("sim", 3)],
            ..req
        };
        let r = Registration::try_from(ok).unwrap();
        assert_eq!(
            r.slots,
            vec![
                SlotCount {
                    kind: ExecutorKind::Docker,
                    slots: 2
                },
                SlotCount {
                    kind: ExecutorKind::Sim,
                    slots: 3
                }
            ]
        );
    }

    #[test]
    fn node_messages_come_in_typed_and_unknown_kinds_are_dropped() {
        let hello = node_message(node_message::Body::Hello(v1::Hello {
            node_id: "n".into(),
            running: vec![v1::AttemptRef {
                task_id: 4,
                epoch: 2,
            }],
            free: vec![wire_slot("process", 1), wire_slot("gpu", 5)],
            draining: true,
            ..Default::default()
        }));
        let Some(NodeMessage::Hello(h)) = hello else {
            panic!("{hello:?}");
        };
        assert_eq!(
            h.running,
            vec![AttemptRef {
                task_id: 4,
                epoch: 2
            }]
        );
        assert_eq!(h.free.len(), 1);
        assert!(h.draining);
        let credit = |kind: &str| {
            node_message(node_message::Body::Credit(v1::Credit {
                kind: kind.into(),
                slots: 1,
            }))
        };
        assert_eq!(credit("gpu"), None);
        assert_eq!(
            credit("sim"),
            Some(NodeMessage::Credit(SlotCount {
                kind: ExecutorKind::Sim,
                slots: 1
            }))
        );
        // A result without its attempt or outcome reads as task 0 (none) with a default outcome.
        let bare = node_message(node_message::Body::Result(v1::AttemptResult::default()));
        assert_eq!(
            bare,
            Some(NodeMessage::Result {
                attempt: AttemptRef::default(),
                outcome: Default::default()
            })
        );
    }

    #[test]
    fn coordinator_messages_go_out_as_the_wire_spells_them() {
        let a = AttemptRef {
            task_id: 9,
            epoch: 3,
        };
        let grant = v1::CoordinatorMessage::from(CoordinatorMessage::Grant(Grant {
            attempt: a,
            run_id: "r".into(),
            kind: ExecutorKind::Process,
            affinity_key: "k".into(),
            agent: "gold".into(),
            variant: "v".into(),
            instance_id: "i".into(),
            payload_json: "{}".into(),
            lease_ms: 5,
            attempt_number: 3,
            upcoming: Some(reprobench_domain::messages::Upcoming {
                task_id: 10,
                payload_json: "{\"next\":1}".into(),
            }),
        }));
        let Some(coordinator_message::Body::Grant(g)) = grant.body else {
            panic!("{grant:?}");
        };
        assert_eq!(g.kind, "process");
        assert_eq!(
            g.upcoming.map(|u| (u.task_id, u.payload_json)),
            Some((10, "{\"next\":1}".to_string()))
        );
        assert_eq!(g.attempt, Some(v1::AttemptRef::from(a)));
        let cancel = v1::CoordinatorMessage::from(CoordinatorMessage::Cancel {
            attempt: a,
            reason: "run cancelled".into(),
        });
        assert!(
            matches!(cancel.body, Some(coordinator_message::Body::Cancel(r)) if r.reason == "run cancelled")
        );
    }

    #[test]
    fn run_summaries_and_progress_cross_the_wire_and_back_unchanged() {
        let summary = RunSummary {
            run_id: "r".into(),
            name: "n".into(),
            state: RunState::Cancelled,
            tasks: 9,
            pending: 1,
            running: 2,
            succeeded: 3,
            failed: 1,
            errored: 1,
            cancelled: 1,
            created_at_ms: 5,
            finished_at_ms: 6,
            retried_attempts: 7,
            unserved_kinds: vec![ExecutorKind::Docker, ExecutorKind::Emulator],
        };
        let wire = v1::RunSummary::from(summary.clone());
        assert_eq!(wire.state, "cancelled");
        assert_eq!(wire.unserved_kinds, ["docker", "emulator"]);
        assert_eq!(RunSummary::from(wire), summary);
        for eta_s in [None, Some(0.0), Some(12.5)] {
            let progress = RunProgress {
                run: summary.clone(),
                nodes: vec![NodeProgress {
                    node_id: "n".into(),
                    live: true,
                    running: 1,
                    finished: 2,
                    slots: 3,
                }],
                eta_s,
            };
            assert_eq!(
                RunProgress::from(v1::RunProgress::from(progress.clone())),
                progress
            );
        }
        let list = RunList {
            runs: vec![summary],
            live_nodes: 2,
        };
        assert_eq!(
            RunList::from(v1::ListRunsResponse::from(list.clone())),
            list
        );
    }
}
