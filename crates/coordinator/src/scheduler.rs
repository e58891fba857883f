//! Which pending task a node gets next. Pure logic, no IO: the coordinator's core and the
//! discrete-event simulation (`sim`) drive the same code.
//!
//! Policy (DESIGN.md, "Scheduling"): tasks are sharded to live nodes by consistent hashing of
//! their affinity key; a node with a free slot takes from its own shard first, the bucket with the
//! longest expected duration first (unknown estimates count as longest, so they are learnt early);
//! when its shard is empty it steals one not-started task from the node with the largest backlog,
//! preferring keys the thief already has warm. Granted tasks leave the scheduler, so a started
//! task can never be stolen. A task named to a node as its next one ([`Scheduler::peek_for`], a
//! hint the node prepares for) is left to that node by thieves that have another to take.
//! `StaticRoundRobin` is the baseline the benchmark compares against.

use reprobench_domain::registry::ExecutorKind;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

/// Task identifier (the store's row id).
pub type TaskId = u64;
/// Node index, assigned by the caller (dense small integers keep the hot path cheap).
pub type NodeIdx = u32;

/// Virtual points per node on the hash ring; enough for an even spread at 4 nodes and at 1,000.
const VNODES: u32 = 64;

/// A choice made for affinity (the node's own shard, a key the thief has warm) yields to a task
/// expected to take more than this many times as long: a long task started late is what
/// stretches a run's tail, and a warm environment saves less than that.
const LONG_TASK_FACTOR: f64 = 2.0;

/// How tasks are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Affinity shards by consistent hashing, longest-expected-first, work stealing.
    AffinityStealing,
    /// Baseline: tasks dealt round-robin to the nodes present at enqueue time, FIFO, no stealing.
    StaticRoundRobin,
}

/// A task waiting for a slot.
#[derive(Debug, Clone)]
pub struct QueuedTask<'a> {
    /// Store id.
    pub id: TaskId,
    /// Executor kind the task needs.
    pub kind: ExecutorKind,
    /// Affinity key (image, app + snapshot).
    pub key: &'a str,
    /// Agent name (estimates are per key and agent).
    pub agent: &'a str,
}

/// A scheduling decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    /// The task to grant.
    pub task: TaskId,
    /// The node whose shard it was taken from, when it was stolen.
    pub stolen_from: Option<NodeIdx>,
}

/// Where [`Scheduler::next_for`] takes a task from.
enum Choice {
    /// The front of `bucket`, in `from`'s shard.
    Bucket { bucket: BucketId, from: NodeIdx },
    /// The front of the node's dealt queue (`StaticRoundRobin`).
    Dealt,
}

type KeyId = u32;
type AgentId = u32;
type BucketId = (KeyId, AgentId);

#[derive(Default)]
struct Interner {
    ids: HashMap<String, u32>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = self.ids.len() as u32;
        self.ids.insert(s.to_string(), id);
        id
    }
    fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }
}

#[derive(Default, Clone, Copy)]
struct Estimate {
    sum_s: f64,
    n: u32,
}

/// Per-kind queues: only nodes offering slots of that kind own shards of it.
#[derive(Default)]
struct KindQueues {
    members: BTreeSet<NodeIdx>,
    ring: Vec<(u64, NodeIdx)>,
    ring_dirty: bool,
    buckets: HashMap<BucketId, VecDeque<TaskId>>,
    owner: HashMap<KeyId, Option<NodeIdx>>,
    shard: HashMap<NodeIdx, HashSet<BucketId>>,
    backlog: HashMap<NodeIdx, usize>,
    by_backlog: BTreeSet<(usize, NodeIdx)>,
    /// Non-empty buckets by expected duration (f64 bits order like the values for non-negatives).
    by_estimate: BTreeSet<(u64, BucketId)>,
    // StaticRoundRobin only.
    static_queues: HashMap<NodeIdx, VecDeque<TaskId>>,
    static_unplaced: VecDeque<TaskId>,
    static_next: usize,
}

/// The scheduler state: pending tasks, shards, estimates and warm keys.
pub struct Scheduler {
    policy: Policy,
    kinds: HashMap<ExecutorKind, KindQueues>,
    keys: Interner,
    /// Ring position of each interned key, hashed from the key's text so shards do not depend
    /// on arrival order (the same key lands on the same node after a coordinator restart).
    key_points: Vec<u64>,
    agents: Interner,
    estimates: HashMap<BucketId, Estimate>,
    warm: HashMap<NodeIdx, HashSet<KeyId>>,
    /// Where each pending task sits: (kind, bucket). Removed tasks are dropped lazily from queues.
    location: HashMap<TaskId, (ExecutorKind, BucketId)>,
    /// The node each pending task was last named to by [`Scheduler::peek_for`], and back.
    named_to: HashMap<TaskId, NodeIdx>,
    named_for: HashMap<NodeIdx, TaskId>,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(policy: Policy) -> Self {
        Scheduler {
            policy,
            kinds: HashMap::new(),
            keys: Interner::default(),
            key_points: Vec::new(),
            agents: Interner::default(),
            estimates: HashMap::new(),
            warm: HashMap::new(),
            location: HashMap::new(),
            named_to: HashMap::new(),
            named_for: HashMap::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// A node became live with slots of these kinds.
    pub fn add_node(&mut self, node: NodeIdx, kinds: &[ExecutorKind]) {
        for kind in kinds {
            let q = self.kinds.entry(*kind).or_default();
            if q.members.insert(node) {
                q.ring_dirty = true;
                q.static_queues.entry(node).or_default();
            }
        }
    }

    /// A node is gone (dead, disconnected or draining): its shards move to the others.
    pub fn remove_node(&mut self, node: NodeIdx) {
        if let Some(&task) = self.named_for.get(&node) {
            self.forget_name(task);
        }
        for q in self.kinds.values_mut() {
            if q.members.remove(&node) {
                q.ring_dirty = true;
                if let Some(tasks) = q.static_queues.remove(&node) {
                    q.static_unplaced.extend(tasks);
                }
            }
        }
    }

    /// Whether the node is a live member for any kind.
    pub fn has_node(&self, node: NodeIdx) -> bool {
        self.kinds.values().any(|q| q.members.contains(&node))
    }

    fn key_id(&mut self, key: &str) -> KeyId {
        let id = self.keys.id(key);
        if id as usize == self.key_points.len() {
            let text_hash = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
            self.key_points.push(mix(text_hash));
        }
        id
    }

    /// Records that a node has a key's environment warm (it ran or prepared it).
    pub fn mark_warm(&mut self, node: NodeIdx, key: &str) {
        let k = self.key_id(key);
        self.warm.entry(node).or_default().insert(k);
    }

    /// Feeds a finished task's duration into the (key, agent) estimate.
    pub fn record_duration(&mut self, key: &str, agent: &str, wall_s: f64) {
        let b = (self.key_id(key), self.agents.id(agent));
        let old = expected_bits(&self.estimates, &b);
        let e = self.estimates.entry(b).or_default();
        e.sum_s += wall_s.max(0.0);
        e.n += 1;
        let new = expected_bits(&self.estimates, &b);
        for q in self.kinds.values_mut() {
            if q.by_estimate.remove(&(old, b)) {
                q.by_estimate.insert((new, b));
            }
        }
    }

    /// Expected duration in seconds for a (key, agent), when any task of it has finished.
    pub fn estimate(&self, key: &str, agent: &str) -> Option<f64> {
        let b = (self.keys.get(key)?, self.agents.get(agent)?);
        self.estimates.get(&b).map(|e| e.sum_s / f64::from(e.n))
    }

    /// Adds a pending task (new, requeued or handed back).
    pub fn enqueue(&mut self, task: QueuedTask<'_>) {
        let b = (self.key_id(task.key), self.agents.id(task.agent));
        self.location.insert(task.id, (task.kind, b));
        let q = self.kinds.entry(task.kind).or_default();
        match self.policy {
            Policy::AffinityStealing => {
                q.refresh_ring(&self.key_points);
                let queue = q.buckets.entry(b).or_default();
                queue.push_back(task.id);
                let was_empty = queue.len() == 1;
                let owner = q.owner_of(b.0, &self.key_points);
                if was_empty {
                    q.by_estimate
                        .insert((expected_bits(&self.estimates, &b), b));
                    if let Some(n) = owner {
                        q.shard.entry(n).or_default().insert(b);
                    }
                }
                if let Some(n) = owner {
                    q.add_backlog(n, 1);
                }
            }
            Policy::StaticRoundRobin => {
                let members: Vec<NodeIdx> = q.members.iter().copied().collect();
                if members.is_empty() {
                    q.static_unplaced.push_back(task.id);
                } else {
                    let n = members[q.static_next % members.len()];
                    q.static_next += 1;
                    q.static_queues.entry(n).or_default().push_back(task.id);
                }
            }
        }
    }

    /// Withdraws a pending task (its run was cancelled). Returns whether it was pending.
    pub fn remove(&mut self, task: TaskId) -> bool {
        let Some((kind, b)) = self.location.remove(&task) else {
            return false;
        };
        self.forget_name(task);
        let Some(q) = self.kinds.get_mut(&kind) else {
            return true;
        };
        match self.policy {
            Policy::AffinityStealing => {
                q.refresh_ring(&self.key_points);
                if let Some(queue) = q.buckets.get_mut(&b)
                    && let Some(pos) = queue.iter().position(|t| *t == task)
                {
                    queue.remove(pos);
                    let empty = queue.is_empty();
                    if empty {
                        q.by_estimate
                            .remove(&(expected_bits(&self.estimates, &b), b));
                    }
                    if let Some(n) = q.owner_of(b.0, &self.key_points) {
                        q.add_backlog(n, -1);
                        if empty && let Some(s) = q.shard.get_mut(&n) {
                            s.remove(&b);
                        }
                    }
                }
            }
            Policy::StaticRoundRobin => {
                for queue in q
                    .static_queues
                    .values_mut()
                    .chain(std::iter::once(&mut q.static_unplaced))
                {
                    queue.retain(|t| *t != task);
                }
            }
        }
        true
    }

    /// The next task for a free slot of `kind` on `node`, or `None` when nothing is runnable there.
    ///
    /// The task [`Scheduler::peek_for`] named for `node`, while it is pending and of `kind`,
    /// comes first: the node announced it and prepared its first execution ahead, whatever
    /// the estimates learned since.
    pub fn next_for(&mut self, node: NodeIdx, kind: ExecutorKind) -> Option<Pick> {
        let choice = self.choose(node, kind)?;
        let q = self.kinds.get_mut(&kind)?;
        let pick = match choice {
            Choice::Bucket { bucket, from } => {
                let queue = q.buckets.get_mut(&bucket)?;
                let task = queue.pop_front()?;
                if queue.is_empty() {
                    q.by_estimate
                        .remove(&(expected_bits(&self.estimates, &bucket), bucket));
                    if let Some(s) = q.shard.get_mut(&from) {
                        s.remove(&bucket);
                    }
                }
                q.add_backlog(from, -1);
                self.warm.entry(node).or_default().insert(bucket.0);
                Pick {
                    task,
                    stolen_from: (from != node).then_some(from),
                }
            }
            Choice::Dealt => Pick {
                task: q.static_queues.get_mut(&node)?.pop_front()?,
                stolen_from: None,
            },
        };
        self.location.remove(&pick.task);
        self.forget_name(pick.task);
        Some(pick)
    }

    /// `task` is no longer anyone's named next task.
    fn forget_name(&mut self, task: TaskId) {
        if let Some(node) = self.named_to.remove(&task) {
            self.named_for.remove(&node);
        }
    }

    /// The task [`Scheduler::next_for`] would give `node` now, taking nothing: what the node
    /// will most likely run next once a slot of `kind` frees (only a hint: other nodes, new
    /// work and finished tasks change it).
    ///
    /// The task is named to `node` from then on: a thief with another task to take leaves it,
    /// and this node's next [`Scheduler::peek_for`] and [`Scheduler::next_for`] give it while
    /// it is pending.
    pub fn peek_for(&mut self, node: NodeIdx, kind: ExecutorKind) -> Option<TaskId> {
        let choice = self.choose(node, kind)?;
        let q = self.kinds.get(&kind)?;
        let task = match choice {
            Choice::Bucket { bucket, .. } => q.buckets.get(&bucket)?.front().copied(),
            Choice::Dealt => q.static_queues.get(&node)?.front().copied(),
        }?;
        if let Some(old) = self.named_for.insert(node, task) {
            self.named_to.remove(&old);
        }
        if let Some(other) = self.named_to.insert(task, node)
            && other != node
        {
            self.named_for.remove(&other);
        }
        Some(task)
    }

    /// Where the next task for `node` of `kind` comes from, taking nothing (it only refreshes
    /// the ring and deals unplaced tasks, which changes no decision). The task named for
    /// `node` first; under `StaticRoundRobin` the node's dealt queue is its order anyway.
    fn choose(&mut self, node: NodeIdx, kind: ExecutorKind) -> Option<Choice> {
        let q = self.kinds.get_mut(&kind)?;
        if !q.members.contains(&node) {
            return None;
        }
        match self.policy {
            Policy::AffinityStealing => {
                q.refresh_ring(&self.key_points);
                // The node prepared its named task ahead: it stays the node's next.
                if let Some(bucket) = named_bucket(&self.named_for, &self.location, q, node, kind) {
                    let from = q.owner_of(bucket.0, &self.key_points)?;
                    return Some(Choice::Bucket { bucket, from });
                }
                // A bucket whose next task is named to another node (its hint).
                let named_elsewhere = |q: &KindQueues, b: &BucketId| {
                    q.buckets
                        .get(b)
                        .and_then(|tasks| tasks.front())
                        .and_then(|t| self.named_to.get(t))
                        .is_some_and(|n| *n != node)
                };
                let estimates = &self.estimates;
                let expected = |b: &BucketId| {
                    estimates
                        .get(b)
                        .map_or(f64::INFINITY, |e| e.sum_s / f64::from(e.n))
                };
                let own = q
                    .shard
                    .get(&node)
                    .and_then(|s| best_bucket(s.iter(), &expected));
                let affine = match own {
                    Some(b) => (b, node),
                    None => {
                        let &(backlog, victim) =
                            q.by_backlog.iter().rev().find(|(_, n)| *n != node)?;
                        if backlog == 0 {
                            return None;
                        }
                        let victim_shard = q.shard.get(&victim)?;
                        // The victim's named task stays its own while the thief has another.
                        let unnamed: Vec<BucketId> = victim_shard
                            .iter()
                            .filter(|b| !named_elsewhere(q, b))
                            .copied()
                            .collect();
                        let candidates: Vec<BucketId> = if unnamed.is_empty() {
                            victim_shard.iter().copied().collect()
                        } else {
                            unnamed
                        };
                        let warm = self.warm.get(&node);
                        let warm_pick = warm.and_then(|w| {
                            best_bucket(candidates.iter().filter(|b| w.contains(&b.0)), &expected)
                        });
                        let best = best_bucket(candidates.iter(), &expected)?;
                        // Warmth wins unless it would leave a much longer task for later: a long
                        // task started late is what stretches a run's tail.
                        let b = match warm_pick {
                            Some(w) if expected(&w) * LONG_TASK_FACTOR >= expected(&best) => w,
                            _ => best,
                        };
                        (b, victim)
                    }
                };
                let longest = q
                    .by_estimate
                    .iter()
                    .rev()
                    .map(|(_, b)| *b)
                    .find(|b| !named_elsewhere(q, b));
                let (bucket, from) = match longest {
                    Some(g) if expected(&g) > LONG_TASK_FACTOR * expected(&affine.0) => {
                        (g, q.owner_of(g.0, &self.key_points)?)
                    }
                    _ => affine,
                };
                Some(Choice::Bucket { bucket, from })
            }
            Policy::StaticRoundRobin => {
                if !q.static_unplaced.is_empty() {
                    let members: Vec<NodeIdx> = q.members.iter().copied().collect();
                    while let Some(t) = q.static_unplaced.pop_front() {
                        let n = members[q.static_next % members.len()];
                        q.static_next += 1;
                        q.static_queues.entry(n).or_default().push_back(t);
                    }
                }
                Some(Choice::Dealt)
            }
        }
    }

    /// Not-started tasks in a node's shard for a kind.
    pub fn backlog(&mut self, node: NodeIdx, kind: ExecutorKind) -> usize {
        let Some(q) = self.kinds.get_mut(&kind) else {
            return 0;
        };
        q.refresh_ring(&self.key_points);
        match self.policy {
            Policy::AffinityStealing => q.backlog.get(&node).copied().unwrap_or(0),
            Policy::StaticRoundRobin => q.static_queues.get(&node).map_or(0, VecDeque::len),
        }
    }

    /// All pending tasks.
    pub fn pending(&self) -> usize {
        self.location.len()
    }
}

/// The bucket of the task named for `node`, when that task is pending, of `kind`, and first in
/// its bucket, so that taking from the bucket takes it.
fn named_bucket(
    named_for: &HashMap<NodeIdx, TaskId>,
    location: &HashMap<TaskId, (ExecutorKind, BucketId)>,
    q: &KindQueues,
    node: NodeIdx,
    kind: ExecutorKind,
) -> Option<BucketId> {
    let task = named_for.get(&node)?;
    let &(task_kind, bucket) = location.get(task)?;
    (task_kind == kind && q.buckets.get(&bucket)?.front() == Some(task)).then_some(bucket)
}

fn expected_bits(estimates: &HashMap<BucketId, Estimate>, b: &BucketId) -> u64 {
    estimates
        .get(b)
        .map_or(f64::INFINITY, |e| e.sum_s / f64::from(e.n))
        .to_bits()
}

/// The bucket with the longest expected duration; ties broken by id so decisions are reproducible.
fn best_bucket<'a>(
    buckets: impl Iterator<Item = &'a BucketId>,
    expected: &impl Fn(&BucketId) -> f64,
) -> Option<BucketId> {
    buckets
        .map(|b| (expected(b), *b))
        .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
        .map(|(_, b)| b)
}

impl KindQueues {
    fn owner_of(&self, key: KeyId, points: &[u64]) -> Option<NodeIdx> {
        self.owner
            .get(&key)
            .copied()
            .flatten()
            .or_else(|| ring_owner(&self.ring, points[key as usize]))
    }

    fn add_backlog(&mut self, node: NodeIdx, delta: isize) {
        let cur = self.backlog.entry(node).or_insert(0);
        self.by_backlog.remove(&(*cur, node));
        *cur = cur.saturating_add_signed(delta);
        if *cur > 0 {
            self.by_backlog.insert((*cur, node));
        }
    }

    /// Rebuilds the ring and re-shards the pending buckets after membership changed.
    fn refresh_ring(&mut self, points: &[u64]) {
        if !self.ring_dirty {
            return;
        }
        self.ring_dirty = false;
        self.ring = self
            .members
            .iter()
            .flat_map(|&n| (0..VNODES).map(move |v| (mix(u64::from(n) << 32 | u64::from(v)), n)))
            .collect();
        self.ring.sort_unstable();
        self.owner.clear();
        self.shard.clear();
        // by_estimate does not depend on ownership and stays as it is.
        self.backlog.clear();
        self.by_backlog.clear();
        let ring = &self.ring;
        let mut owners: HashMap<KeyId, Option<NodeIdx>> = HashMap::new();
        let mut moves: Vec<(NodeIdx, BucketId, usize)> = Vec::new();
        for (b, queue) in &self.buckets {
            let owner = *owners
                .entry(b.0)
                .or_insert_with(|| ring_owner(ring, points[b.0 as usize]));
            if let (Some(n), false) = (owner, queue.is_empty()) {
                moves.push((n, *b, queue.len()));
            }
        }
        self.owner = owners;
        for (n, b, len) in moves {
            self.shard.entry(n).or_default().insert(b);
            self.add_backlog(n, len as isize);
        }
    }
}

fn ring_owner(ring: &[(u64, NodeIdx)], h: u64) -> Option<NodeIdx> {
    if ring.is_empty() {
        return None;
    }
    let i = ring.partition_point(|(p, _)| *p < h);
    Some(ring[i % ring.len()].1)
}

/// A 64-bit finalizer (SplitMix64's), stable across Rust versions unlike `DefaultHasher`.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: ExecutorKind = ExecutorKind::Synthetic;

    fn sched(nodes: &[NodeIdx]) -> Scheduler {
        let mut s = Scheduler::new(Policy::AffinityStealing);
        for &n in nodes {
            s.add_node(n, &[K]);
        }
        s
    }

    fn enqueue(s: &mut Scheduler, id: TaskId, key: &str) {
        s.enqueue(QueuedTask {
            id,
            kind: K,
            key,
            agent: "a",
        });
    }

    #[test]
    fn same_key_goes_to_the_same_shard() {
        let mut s = sched(&[0, 1, 2]);
        for id in 0..10 {
            enqueue(&mut s, id, "image-x");
        }
        let owners: Vec<usize> = (0..3).map(|n| s.backlog(n, K)).collect();
        assert_eq!(owners.iter().sum::<usize>(), 10);
        assert_eq!(owners.iter().filter(|b| **b == 10).count(), 1, "{owners:?}");
    }

    #[test]
    fn owner_takes_own_shard_and_idle_node_steals_without_double_grants() {
        let mut s = sched(&[0, 1]);
        for id in 0..6 {
            enqueue(&mut s, id, "only-key");
        }
        let owner = if s.backlog(0, K) == 6 { 0 } else { 1 };
        let thief = 1 - owner;
        let p = s.next_for(owner, K).unwrap();
        assert_eq!(p.stolen_from, None);
        let p = s.next_for(thief, K).unwrap();
        assert_eq!(p.stolen_from, Some(owner));
        let mut seen: BTreeSet<TaskId> = BTreeSet::new();
        seen.insert(0);
        seen.insert(p.task);
        while let Some(p) = s.next_for(thief, K) {
            assert!(seen.insert(p.task), "task {} granted twice", p.task);
        }
        assert_eq!(seen.len(), 6);
        assert_eq!(s.pending(), 0);
        assert_eq!(s.backlog(owner, K), 0);
    }

    #[test]
    fn longest_expected_first_and_unknown_before_known() {
        let mut s = sched(&[0]);
        s.record_duration("short", "a", 1.0);
        s.record_duration("long", "a", 9.0);
        enqueue(&mut s, 1, "short");
        enqueue(&mut s, 2, "long");
        enqueue(&mut s, 3, "never-seen");
        let order: Vec<TaskId> = std::iter::from_fn(|| s.next_for(0, K).map(|p| p.task)).collect();
        assert_eq!(order, vec![3, 2, 1]);
    }

    #[test]
    fn thief_prefers_keys_it_has_warm() {
        let mut s = sched(&[0, 1]);
        // Find two keys that both land on node 0.
        let keys: Vec<String> = (0..200)
            .map(|i| format!("k{i}"))
            .filter(|k| {
                let mut probe = sched(&[0, 1]);
                enqueue(&mut probe, 0, k);
                probe.backlog(0, K) == 1
            })
            .take(2)
            .collect();
        s.record_duration(&keys[0], "a", 1.5); // longer, but not warm on the thief
        s.record_duration(&keys[1], "a", 1.0);
        enqueue(&mut s, 1, &keys[0]);
        enqueue(&mut s, 2, &keys[1]);
        s.mark_warm(1, &keys[1]);
        assert_eq!(
            s.next_for(1, K),
            Some(Pick {
                task: 2,
                stolen_from: Some(0)
            })
        );
        // A task expected to take far longer than the warm one is not left for the tail.
        let mut s = sched(&[0, 1]);
        s.record_duration(&keys[0], "a", 100.0);
        s.record_duration(&keys[1], "a", 1.0);
        enqueue(&mut s, 1, &keys[0]);
        enqueue(&mut s, 2, &keys[1]);
        s.mark_warm(1, &keys[1]);
        assert_eq!(
            s.next_for(1, K),
            Some(Pick {
                task: 1,
                stolen_from: Some(0)
            })
        );
    }

    #[test]
    fn own_shard_yields_to_a_much_longer_task_elsewhere() {
        let mut s = sched(&[0, 1]);
        let on = |node: NodeIdx| {
            move |k: &String| {
                let mut probe = sched(&[0, 1]);
                enqueue(&mut probe, 0, k);
                probe.backlog(node, K) == 1
            }
        };
        let mine = (0..200).map(|i| format!("k{i}")).find(on(0)).unwrap();
        let theirs = (0..200).map(|i| format!("k{i}")).find(on(1)).unwrap();
        s.record_duration(&mine, "a", 1.0);
        s.record_duration(&theirs, "a", 10.0);
        enqueue(&mut s, 1, &mine);
        enqueue(&mut s, 2, &theirs);
        assert_eq!(
            s.next_for(0, K),
            Some(Pick {
                task: 2,
                stolen_from: Some(1)
            })
        );
        assert_eq!(
            s.next_for(0, K),
            Some(Pick {
                task: 1,
                stolen_from: None
            })
        );
    }

    #[test]
    fn a_dead_nodes_shard_moves_and_removed_tasks_are_not_granted() {
        let mut s = sched(&[0, 1, 2]);
        for id in 0..30 {
            enqueue(&mut s, id, &format!("key{}", id % 7));
        }
        assert!(s.remove(5));
        assert!(!s.remove(5));
        s.remove_node(1);
        assert_eq!(s.backlog(1, K), 0);
        assert_eq!(s.backlog(0, K) + s.backlog(2, K), 29);
        assert_eq!(s.next_for(1, K), None, "a removed node gets nothing");
        let mut got: Vec<TaskId> =
            std::iter::from_fn(|| s.next_for(0, K).map(|p| p.task)).collect();
        got.sort();
        assert_eq!(got, (0..30).filter(|t| *t != 5).collect::<Vec<_>>());
    }

    #[test]
    fn tasks_wait_for_a_node_of_their_kind() {
        let mut s = Scheduler::new(Policy::AffinityStealing);
        s.enqueue(QueuedTask {
            id: 1,
            kind: ExecutorKind::Docker,
            key: "img",
            agent: "a",
        });
        s.add_node(0, &[K]);
        assert_eq!(s.next_for(0, ExecutorKind::Docker), None);
        s.add_node(1, &[ExecutorKind::Docker]);
        assert_eq!(s.next_for(1, ExecutorKind::Docker).map(|p| p.task), Some(1));
    }

    #[test]
    fn peek_names_the_task_next_for_then_grants_under_both_policies() {
        for policy in [Policy::AffinityStealing, Policy::StaticRoundRobin] {
            let mut s = Scheduler::new(policy);
            for n in 0..3 {
                s.add_node(n, &[K]);
            }
            // A fixed pseudo-random mix of keys, removals, estimates and grants.
            let mut z = 7u64;
            let mut next_id = 0;
            let (mut peeked, mut granted) = (0, 0);
            for step in 0..600u64 {
                z = mix(z.wrapping_add(step));
                match z % 5 {
                    0 | 1 => {
                        let key = format!("k{}", (z >> 8) % 7);
                        enqueue(&mut s, next_id, &key);
                        next_id += 1;
                    }
                    2 => {
                        s.remove((z >> 8) % next_id.max(1));
                    }
                    3 => s.record_duration(
                        &format!("k{}", (z >> 8) % 7),
                        "a",
                        (z >> 16) as f64 % 50.0,
                    ),
                    _ => {
                        let node = ((z >> 8) % 3) as NodeIdx;
                        let peek = s.peek_for(node, K);
                        let got = s.next_for(node, K).map(|p| p.task);
                        assert_eq!(peek, got, "{policy:?}, step {step}");
                        peeked += usize::from(peek.is_some());
                        granted += usize::from(got.is_some());
                    }
                }
            }
            assert!(
                peeked > 50 && peeked == granted,
                "{policy:?}: {peeked} peeks"
            );
        }
    }

    #[test]
    fn the_named_task_is_named_again_and_granted_even_when_the_estimates_change_after_the_peek() {
        // One node; task 2's key looks longer, so it goes first.
        let two_tasks = || {
            let mut s = Scheduler::new(Policy::AffinityStealing);
            s.add_node(0, &[K]);
            enqueue(&mut s, 1, "short");
            enqueue(&mut s, 2, "long");
            s.record_duration("short", "a", 10.0);
            s.record_duration("long", "a", 12.0);
            s
        };
        let mut s = two_tasks();
        let named = s.peek_for(0, K);
        assert_eq!(named, Some(2));
        // The other key now looks far longer: unnamed, it would go first.
        s.record_duration("short", "a", 1000.0);
        let mut unnamed = two_tasks();
        unnamed.record_duration("short", "a", 1000.0);
        assert_eq!(unnamed.peek_for(0, K), Some(1));
        assert_eq!(unnamed.next_for(0, K).map(|p| p.task), Some(1));
        // Named, it is named again by the next peek, and granted; then the other.
        assert_eq!(s.peek_for(0, K), Some(2));
        assert_eq!(s.next_for(0, K).map(|p| p.task), Some(2));
        assert_eq!(s.next_for(0, K).map(|p| p.task), Some(1));
        assert_eq!(s.next_for(0, K), None);
        // A named task removed before its grant names nothing.
        enqueue(&mut s, 3, "x");
        enqueue(&mut s, 4, "y");
        let named = s.peek_for(0, K).unwrap();
        s.remove(named);
        let other = if named == 3 { 4 } else { 3 };
        assert_eq!(s.next_for(0, K).map(|p| p.task), Some(other));
    }

    #[test]
    fn a_thief_leaves_the_task_named_to_its_owner_while_it_has_another() {
        let mut s = Scheduler::new(Policy::AffinityStealing);
        s.add_node(0, &[K]);
        s.add_node(1, &[K]);
        for id in 0..12 {
            enqueue(&mut s, id, &format!("k{id}"));
        }
        // Node 1 runs its own shard dry; node 0 keeps at least three tasks of its own.
        while s.backlog(1, K) > 0 {
            assert_eq!(s.next_for(1, K).unwrap().stolen_from, None);
        }
        let owned = s.backlog(0, K);
        assert!(owned >= 3, "node 0 holds {owned}");
        // Node 0 is told its next task; the thief takes another of node 0's, never that one.
        let named = s.peek_for(0, K).unwrap();
        for _ in 0..owned - 1 {
            let pick = s.next_for(1, K).unwrap();
            assert_eq!(pick.stolen_from, Some(0));
            assert_ne!(pick.task, named);
        }
        // Only the named task is left: the thief takes it rather than idle.
        assert_eq!(s.next_for(1, K).map(|p| p.task), Some(named));
        assert_eq!(s.next_for(0, K), None);

        // Granted to its node, a name is spent: a thief then takes any task.
        for id in 100..103 {
            enqueue(&mut s, id, "one key");
        }
        let owner = (0..2).find(|n| s.backlog(*n, K) == 3).unwrap();
        let named = s.peek_for(owner, K).unwrap();
        assert_eq!(s.next_for(owner, K).map(|p| p.task), Some(named));
        assert!(s.next_for(1 - owner, K).is_some());
    }

    #[test]
    fn static_round_robin_deals_and_never_steals() {
        let mut s = Scheduler::new(Policy::StaticRoundRobin);
        s.add_node(0, &[K]);
        s.add_node(1, &[K]);
        for id in 0..4 {
            enqueue(&mut s, id, "k");
        }
        assert_eq!(s.next_for(0, K).map(|p| p.task), Some(0));
        assert_eq!(s.next_for(0, K).map(|p| p.task), Some(2));
        assert_eq!(s.next_for(0, K), None);
        assert_eq!(s.next_for(1, K).map(|p| p.task), Some(1));
    }
}
