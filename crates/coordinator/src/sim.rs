//! Discrete-event simulation of a cluster, driving the real [`Scheduler`] (not a copy), to see
//! how the policy behaves at a scale this machine cannot host: makespan against its lower bound,
//! and the scheduler's own time per task.

use crate::scheduler::{NodeIdx, Policy, QueuedTask, Scheduler};
use reprobench_domain::synthetic::SyntheticDataset;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Nodes in the cluster.
    pub nodes: u32,
    /// Slots per node.
    pub slots_per_node: u32,
    /// Tasks in the workload.
    pub tasks: u32,
    /// Mean task duration (ms).
    pub mean_ms: f64,
    /// Log-space sigma of durations.
    pub sigma: f64,
    /// Distinct affinity keys.
    pub keys: u32,
    /// Workload seed.
    pub seed: u64,
    /// Policy under test.
    pub policy: Policy,
}

/// What the simulation measured.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// Simulated makespan (ms).
    pub makespan_ms: f64,
    /// max(total work / slots, longest task) (ms).
    pub lower_bound_ms: f64,
    /// makespan / lower bound.
    pub makespan_ratio: f64,
    /// Time spent inside scheduler calls (enqueue, pick, estimate updates).
    pub scheduler_time: Duration,
    /// Scheduler time per task, in microseconds.
    pub scheduler_us_per_task: f64,
    /// Grants that were steals.
    pub steals: u64,
    /// Tasks run (equals `tasks` unless something is wrong).
    pub completed: u64,
}

/// Runs the simulation.
pub fn simulate(cfg: &SimConfig) -> SimReport {
    let dataset = SyntheticDataset {
        tasks: cfg.tasks,
        mean_ms: cfg.mean_ms,
        sigma: cfg.sigma,
        keys: cfg.keys,
    };
    let instances = dataset.instances(cfg.seed);
    let durations: Vec<f64> = instances.iter().map(|i| i.duration_ms as f64).collect();
    let total_slots = f64::from(cfg.nodes * cfg.slots_per_node);
    let longest = durations.iter().copied().fold(0.0, f64::max);
    let lower_bound_ms = (durations.iter().sum::<f64>() / total_slots).max(longest);

    let kind = reprobench_domain::registry::ExecutorKind::Synthetic;
    let kinds = [kind];
    let mut sched = Scheduler::new(cfg.policy);
    let mut in_sched = Duration::ZERO;
    let mut timed = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        in_sched += t.elapsed();
    };
    timed(&mut || {
        for n in 0..cfg.nodes {
            sched.add_node(n, &kinds);
        }
        for (id, inst) in instances.iter().enumerate() {
            sched.enqueue(QueuedTask {
                id: id as u64,
                kind,
                key: &inst.affinity_key,
                agent: "synthetic",
            });
        }
    });

    // Events: (finish time in µs, node, task).
    let mut events: BinaryHeap<Reverse<(u64, NodeIdx, u64)>> = BinaryHeap::new();
    let mut steals = 0u64;
    let mut completed = 0u64;
    let mut start = |sched: &mut Scheduler,
                     node: NodeIdx,
                     now_us: u64,
                     events: &mut BinaryHeap<_>,
                     in_sched: &mut Duration| {
        let t = Instant::now();
        let pick = sched.next_for(node, kind);
        *in_sched += t.elapsed();
        if let Some(p) = pick {
            steals += u64::from(p.stolen_from.is_some());
            let d_us = (durations[p.task as usize] * 1000.0) as u64;
            events.push(Reverse((now_us + d_us, node, p.task)));
        }
    };
    for n in 0..cfg.nodes {
        for _ in 0..cfg.slots_per_node {
            start(&mut sched, n, 0, &mut events, &mut in_sched);
        }
    }
    let mut makespan_us = 0u64;
    while let Some(Reverse((t_us, node, task))) = events.pop() {
        makespan_us = t_us;
        completed += 1;
        let inst = &instances[task as usize];
        let t = Instant::now();
        sched.record_duration(
            &inst.affinity_key,
            "synthetic",
            durations[task as usize] / 1000.0,
        );
        in_sched += t.elapsed();
        start(&mut sched, node, t_us, &mut events, &mut in_sched);
    }
    let makespan_ms = makespan_us as f64 / 1000.0;
    SimReport {
        makespan_ms,
        lower_bound_ms,
        makespan_ratio: if lower_bound_ms > 0.0 {
            makespan_ms / lower_bound_ms
        } else {
            1.0
        },
        scheduler_time: in_sched,
        scheduler_us_per_task: in_sched.as_secs_f64() * 1e6 / f64::from(cfg.tasks.max(1)),
        steals,
        completed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(policy: Policy) -> SimConfig {
        SimConfig {
            nodes: 20,
            slots_per_node: 2,
            tasks: 2_000,
            mean_ms: 100.0,
            sigma: 1.0,
            keys: 20,
            seed: 1,
            policy,
        }
    }

    #[test]
    fn every_task_runs_once_and_the_makespan_respects_the_bound() {
        for policy in [Policy::AffinityStealing, Policy::StaticRoundRobin] {
            let r = simulate(&cfg(policy));
            assert_eq!(r.completed, 2_000, "{policy:?}");
            assert!(
                r.makespan_ratio >= 1.0 - 1e-9,
                "{policy:?}: {}",
                r.makespan_ratio
            );
        }
    }

    #[test]
    fn stealing_beats_static_sharding_on_a_skewed_load() {
        let ours = simulate(&cfg(Policy::AffinityStealing));
        let baseline = simulate(&cfg(Policy::StaticRoundRobin));
        assert!(ours.steals > 0);
        assert!(
            ours.makespan_ratio < baseline.makespan_ratio,
            "{} vs {}",
            ours.makespan_ratio,
            baseline.makespan_ratio
        );
    }
}
