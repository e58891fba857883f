//! What the coordinator learns from Kubernetes and does through it (`serve --kubernetes`):
//! - it watches its release's node pods, and when one is deleted, fails or vanishes while the
//!   watch was down, the leases of that node (named after its pod) are released at once
//!   ([`Command::NodeGone`]) instead of after the lease timeout;
//! - it keeps each node pod's `controller.kubernetes.io/pod-deletion-cost` at the attempts its
//!   node holds, so a scale-in removes idle pods first (the nodes themselves hold no cluster
//!   credentials);
//! - for clusters without KEDA, an optional built-in scaler patches a pool's Deployment replicas
//!   between a minimum and a maximum from the pending and running counts of its executor kinds.
//!
//! Only core/v1 Pods (get, list, watch, patch) and apps/v1 `deployments/scale` (get, patch) are
//! used: every server since 1.20 serves them (the deletion cost is honoured from 1.22).
//! [`NodePods`], [`ScaleDecider`] and [`cost_changes`] are pure.

use crate::core::{Command, CoreHandle, KindCounts};
use futures_util::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Node pods seen by the watcher, and which are gone (pure).
#[derive(Debug, Default)]
pub struct NodePods {
    known: BTreeSet<String>,
    /// Pods listed since the watch (re)started, while it relists.
    relisting: Option<BTreeSet<String>>,
    /// Pods already reported gone (a failed pod stays listed until it is deleted).
    reported: BTreeSet<String>,
}

/// Why a pod's node is gone, if it is: it failed or completed (its node process ended).
fn ended(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    match status.phase.as_deref()? {
        phase @ ("Failed" | "Succeeded") => Some(match status.reason.as_deref() {
            Some(reason) => format!("is {} ({reason})", phase.to_lowercase()),
            None => format!("is {}", phase.to_lowercase()),
        }),
        _ => None,
    }
}

impl NodePods {
    /// Takes one watcher event; returns the nodes that are gone, with the reason in words.
    pub fn on_event(&mut self, event: watcher::Event<Pod>) -> Vec<(String, String)> {
        let mut gone = Vec::new();
        match event {
            watcher::Event::Init => self.relisting = Some(BTreeSet::new()),
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                let Some(name) = pod.metadata.name.clone() else {
                    return gone;
                };
                if let Some(listed) = &mut self.relisting {
                    listed.insert(name.clone());
                }
                self.known.insert(name.clone());
                match ended(&pod) {
                    Some(why) if self.reported.insert(name.clone()) => {
                        gone.push((name.clone(), format!("node pod {name} {why}")));
                    }
                    Some(_) => {}
                    // Running again (a pod of the same name, recreated): report its next end.
                    None => {
                        self.reported.remove(&name);
                    }
                }
            }
            watcher::Event::InitDone => {
                if let Some(listed) = self.relisting.take() {
                    for name in self.known.difference(&listed) {
                        if !self.reported.contains(name) {
                            gone.push((
                                name.clone(),
                                format!("node pod {name} was deleted while the watch was down"),
                            ));
                        }
                    }
                    self.reported.retain(|n| listed.contains(n));
                    self.known = listed;
                }
            }
            watcher::Event::Delete(pod) => {
                let Some(name) = pod.metadata.name else {
                    return gone;
                };
                self.known.remove(&name);
                if !self.reported.remove(&name) {
                    gone.push((name.clone(), format!("node pod {name} was deleted")));
                }
            }
        }
        gone
    }
}

/// Watches the pods matching `selector` in `namespace` and tells the core about gone nodes,
/// until the process ends. Watch errors are retried with the watcher's backoff.
pub async fn watch_node_pods(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    core: CoreHandle,
) {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let mut stream = watcher::watcher(pods, watcher::Config::default().labels(selector)).boxed();
    let mut tracker = NodePods::default();
    let mut backoff = Duration::from_millis(500);
    tracing::info!(namespace, selector, "watching node pods");
    loop {
        match stream.next().await {
            Some(Ok(event)) => {
                backoff = Duration::from_millis(500);
                for (node_id, reason) in tracker.on_event(event) {
                    tracing::info!(node = %node_id, %reason, "node gone");
                    if core.send(Command::NodeGone { node_id, reason }).is_err() {
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "watching node pods failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
            None => return,
        }
    }
}

/// One pool the built-in scaler sizes: a Deployment, the executor kinds its pods offer, the
/// slots of one pod, and the bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledPool {
    /// Deployment name.
    pub deployment: String,
    /// Executor kinds whose tasks the pool serves.
    pub kinds: Vec<String>,
    /// Slots of one pod.
    pub slots_per_replica: u32,
    /// Fewest replicas.
    pub min: u32,
    /// Most replicas.
    pub max: u32,
}

/// The `--scale` syntax, for error messages.
const SCALED_POOL_SYNTAX: &str =
    "DEPLOYMENT:KIND[+KIND...]:SLOTS:MIN:MAX, e.g. rb-reprobench-node-docker:docker:2:0:8";

/// Why a `--scale` pool specification does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScaledPoolError {
    /// The specification does not have five `:`-separated fields.
    #[error("`{spec}`: five fields expected; give {SCALED_POOL_SYNTAX}")]
    FieldCount { spec: String },
    /// SLOTS, MIN or MAX is not a non-negative integer.
    #[error("`{spec}`: {field} is not a number; give {SCALED_POOL_SYNTAX}")]
    NotANumber { spec: String, field: &'static str },
    /// DEPLOYMENT or KIND is empty.
    #[error("`{spec}`: DEPLOYMENT and KIND are needed; give {SCALED_POOL_SYNTAX}")]
    MissingName { spec: String },
    /// SLOTS is zero or MIN exceeds MAX.
    #[error("`{spec}`: SLOTS must be at least 1 and MIN at most MAX; give {SCALED_POOL_SYNTAX}")]
    BadBounds { spec: String },
}

impl std::str::FromStr for ScaledPool {
    type Err = ScaledPoolError;

    /// `DEPLOYMENT:KIND[+KIND...]:SLOTS:MIN:MAX`, e.g. `rb-reprobench-node-docker:docker:2:0:8`.
    fn from_str(s: &str) -> Result<Self, ScaledPoolError> {
        let spec = || s.to_string();
        let parts: Vec<&str> = s.split(':').collect();
        let [deployment, kinds, slots, min, max] = parts[..] else {
            return Err(ScaledPoolError::FieldCount { spec: spec() });
        };
        let number = |v: &str, field: &'static str| {
            v.parse::<u32>().map_err(|_| ScaledPoolError::NotANumber {
                spec: spec(),
                field,
            })
        };
        let pool = ScaledPool {
            deployment: deployment.to_string(),
            kinds: kinds
                .split('+')
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect(),
            slots_per_replica: number(slots, "SLOTS")?,
            min: number(min, "MIN")?,
            max: number(max, "MAX")?,
        };
        if pool.deployment.is_empty() || pool.kinds.is_empty() {
            return Err(ScaledPoolError::MissingName { spec: spec() });
        }
        if pool.slots_per_replica == 0 || pool.min > pool.max {
            return Err(ScaledPoolError::BadBounds { spec: spec() });
        }
        Ok(pool)
    }
}

/// Replicas a pool should have (pure): enough pods for its pending and running tasks, within its
/// bounds; up at once, down only after the demand has stayed lower for `down_delay`, so a pause
/// between runs does not tear the pool down.
#[derive(Debug)]
pub struct ScaleDecider {
    /// The pool.
    pub pool: ScaledPool,
    /// How long the demand must stay below the replicas before scaling down.
    pub down_delay: Duration,
    lower_since: Option<Instant>,
}

impl ScaleDecider {
    /// A decider for `pool`.
    pub fn new(pool: ScaledPool, down_delay: Duration) -> Self {
        ScaleDecider {
            pool,
            down_delay,
            lower_since: None,
        }
    }

    /// The replicas to set now, or `None` to leave `current` as it is.
    pub fn decide(&mut self, counts: &[KindCounts], current: u32, now: Instant) -> Option<u32> {
        let demand: u64 = counts
            .iter()
            .filter(|c| self.pool.kinds.iter().any(|k| k == c.kind.as_str()))
            .map(|c| c.pending + c.running)
            .sum();
        let wanted = demand.div_ceil(u64::from(self.pool.slots_per_replica));
        let wanted = wanted.clamp(u64::from(self.pool.min), u64::from(self.pool.max)) as u32;
        if wanted >= current {
            self.lower_since = None;
            return (wanted > current).then_some(wanted);
        }
        let since = *self.lower_since.get_or_insert(now);
        if now.duration_since(since) >= self.down_delay {
            self.lower_since = None;
            Some(wanted)
        } else {
            None
        }
    }
}

/// Reads a Deployment's replicas through its scale subresource.
pub async fn replicas(deployments: &Api<Deployment>, name: &str) -> kube::Result<u32> {
    let scale = deployments.get_scale(name).await?;
    Ok(scale.spec.and_then(|s| s.replicas).unwrap_or(0).max(0) as u32)
}

/// Sets a Deployment's replicas through its scale subresource.
pub async fn set_replicas(
    deployments: &Api<Deployment>,
    name: &str,
    replicas: u32,
) -> kube::Result<()> {
    let patch = serde_json::json!({ "spec": { "replicas": replicas } });
    deployments
        .patch_scale(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Every `period`, sizes each pool from the core's counts, until the process ends.
pub async fn run_scaler(
    client: kube::Client,
    namespace: &str,
    pools: Vec<ScaledPool>,
    period: Duration,
    down_delay: Duration,
    core: CoreHandle,
) {
    let deployments: Api<Deployment> = Api::namespaced(client, namespace);
    let mut deciders: Vec<ScaleDecider> = pools
        .into_iter()
        .map(|p| ScaleDecider::new(p, down_delay))
        .collect();
    loop {
        let Some(counts) = crate::metrics::counts(&core).await else {
            return;
        };
        for d in &mut deciders {
            let name = d.pool.deployment.clone();
            let current = match replicas(&deployments, &name).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!(deployment = %name, error = %e, "cannot read the pool's replicas");
                    continue;
                }
            };
            if let Some(n) = d.decide(&counts, current, Instant::now()) {
                tracing::info!(deployment = %name, from = current, to = n, "scaling the pool");
                if let Err(e) = set_replicas(&deployments, &name, n).await {
                    tracing::warn!(deployment = %name, error = %e, "cannot scale the pool");
                }
            }
        }
        tokio::time::sleep(period).await;
    }
}

/// The annotation the ReplicaSet controller reads when it picks pods to remove.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The deletion cost of a node pod holding `attempts`: 0 when idle, higher when busier.
pub fn deletion_cost(attempts: u64) -> i32 {
    i32::try_from(attempts).unwrap_or(i32::MAX)
}

/// The pods whose deletion cost must change, given each connected node's attempts and the costs
/// written last (pure). `written` forgets nodes no longer connected, so a pod that comes back
/// gets its cost again.
pub fn cost_changes(
    loads: &[(String, u64)],
    written: &mut HashMap<String, i32>,
) -> Vec<(String, i32)> {
    written.retain(|node, _| loads.iter().any(|(n, _)| n == node));
    loads
        .iter()
        .map(|(node, attempts)| (node.clone(), deletion_cost(*attempts)))
        .filter(|(node, cost)| written.get(node) != Some(cost))
        .collect()
}

/// Whether `labels` satisfy an equality selector (`k=v,k2=v2`, as `--node-pod-selector` is).
pub fn selector_matches(
    selector: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|term| !term.is_empty())
        .all(|term| match term.split_once('=') {
            Some((k, v)) => labels.get(k.trim()).map(String::as_str) == Some(v.trim()),
            None => labels.contains_key(term),
        })
}

/// Sets a pod's deletion cost (a merge patch of its annotation).
pub async fn set_deletion_cost(pods: &Api<Pod>, pod: &str, cost: i32) -> kube::Result<()> {
    let patch =
        serde_json::json!({ "metadata": { "annotations": { DELETION_COST: cost.to_string() } } });
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Every `period`, sets each connected node's pod deletion cost to the attempts it holds, so a
/// scale-in removes idle pods first. Only pods of `namespace` that match `selector` are patched
/// (a node whose name is no such pod, such as a machine outside the cluster, is left alone):
/// nodes hold no cluster credentials at all. Runs until the core stops.
pub async fn keep_deletion_costs(
    client: kube::Client,
    namespace: &str,
    selector: &str,
    core: CoreHandle,
    period: Duration,
) {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let mut written: HashMap<String, i32> = HashMap::new();
    loop {
        let (reply, rx) = tokio::sync::oneshot::channel();
        if core.send(Command::NodeLoads { reply }).is_err() {
            return;
        }
        let Ok(loads) = rx.await else { return };
        for (node, cost) in cost_changes(&loads, &mut written) {
            let is_node_pod = match pods.get_opt(&node).await {
                Ok(Some(pod)) => selector_matches(
                    selector,
                    pod.metadata.labels.as_ref().unwrap_or(&Default::default()),
                ),
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(pod = %node, error = %e, "cannot read the node's pod");
                    continue;
                }
            };
            if is_node_pod && let Err(e) = set_deletion_cost(&pods, &node, cost).await {
                tracing::warn!(pod = %node, error = %e, "cannot update the pod's deletion cost");
                continue;
            }
            // Not a node pod: remembered, so it is not looked up again until its load changes.
            written.insert(node, cost);
        }
        tokio::time::sleep(period).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use reprobench_domain::registry::ExecutorKind;
    use std::pin::pin;

    fn pod(name: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "resourceVersion": "1"},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn deleted_failed_and_vanished_pods_are_gone_once() {
        let mut t = NodePods::default();
        assert!(t.on_event(watcher::Event::Init).is_empty());
        for name in ["a", "b", "c", "d"] {
            assert!(
                t.on_event(watcher::Event::InitApply(pod(name, "Running")))
                    .is_empty()
            );
        }
        assert!(t.on_event(watcher::Event::InitDone).is_empty());
        let gone = t.on_event(watcher::Event::Delete(pod("a", "Running")));
        assert_eq!(gone, vec![("a".into(), "node pod a was deleted".into())]);
        let gone = t.on_event(watcher::Event::Apply(pod("b", "Failed")));
        assert_eq!(gone, vec![("b".into(), "node pod b is failed".into())]);
        // Still failed on its next update, then deleted: reported once.
        assert!(
            t.on_event(watcher::Event::Apply(pod("b", "Failed")))
                .is_empty()
        );
        assert!(
            t.on_event(watcher::Event::Delete(pod("b", "Failed")))
                .is_empty()
        );
        // The watch restarts; c was deleted meanwhile, d is still there.
        t.on_event(watcher::Event::Init);
        t.on_event(watcher::Event::InitApply(pod("d", "Running")));
        let gone = t.on_event(watcher::Event::InitDone);
        assert_eq!(
            gone,
            vec![(
                "c".into(),
                "node pod c was deleted while the watch was down".into()
            )]
        );
        // A pod recreated under a used name is watched anew.
        assert!(
            t.on_event(watcher::Event::Apply(pod("b", "Pending")))
                .is_empty()
        );
        assert_eq!(
            t.on_event(watcher::Event::Delete(pod("b", "Running")))
                .len(),
            1
        );
    }

    fn counts(docker: (u64, u64), sim: (u64, u64)) -> Vec<KindCounts> {
        vec![
            KindCounts {
                kind: ExecutorKind::Docker,
                pending: docker.0,
                running: docker.1,
            },
            KindCounts {
                kind: ExecutorKind::Sim,
                pending: sim.0,
                running: sim.1,
            },
        ]
    }

    #[test]
    fn the_scaler_follows_demand_up_at_once_and_down_after_the_delay() {
        let pool: ScaledPool = "rb-node-docker:docker:2:1:4".parse().unwrap();
        assert_eq!(pool.kinds, vec!["docker"]);
        let mut d = ScaleDecider::new(pool, Duration::from_secs(60));
        let t0 = Instant::now();
        // 5 docker tasks need 3 pods of 2 slots; sim's tasks are not this pool's.
        assert_eq!(d.decide(&counts((4, 1), (50, 0)), 1, t0), Some(3));
        // Within the bound.
        assert_eq!(d.decide(&counts((20, 2), (0, 0)), 3, t0), Some(4));
        assert_eq!(d.decide(&counts((20, 2), (0, 0)), 4, t0), None);
        // Demand drops: nothing until it has stayed low for the delay, then the minimum.
        let quiet = counts((0, 0), (0, 0));
        assert_eq!(d.decide(&quiet, 4, t0), None);
        assert_eq!(d.decide(&quiet, 4, t0 + Duration::from_secs(59)), None);
        assert_eq!(d.decide(&quiet, 4, t0 + Duration::from_secs(60)), Some(1));
        // A rise in between restarts the delay.
        assert_eq!(d.decide(&quiet, 3, t0 + Duration::from_secs(100)), None);
        assert_eq!(
            d.decide(&counts((6, 0), (0, 0)), 3, t0 + Duration::from_secs(130)),
            None
        );
        assert_eq!(d.decide(&quiet, 3, t0 + Duration::from_secs(140)), None);
        assert_eq!(d.decide(&quiet, 3, t0 + Duration::from_secs(199)), None);
        assert_eq!(d.decide(&quiet, 3, t0 + Duration::from_secs(200)), Some(1));
    }

    #[test]
    fn scaled_pools_parse_or_say_how_to_write_them() {
        let p: ScaledPool = "d:docker+process:4:0:10".parse().unwrap();
        assert_eq!(
            (p.kinds.len(), p.slots_per_replica, p.min, p.max),
            (2, 4, 0, 10)
        );
        for bad in [
            "d:docker:2:0",
            "d:docker:x:0:1",
            "d:docker:0:0:1",
            "d:docker:2:5:1",
            ":docker:2:0:1",
        ] {
            let e = bad.parse::<ScaledPool>().unwrap_err();
            assert!(e.to_string().contains("DEPLOYMENT:KIND"), "{bad}: {e}");
        }
        assert_eq!(
            "d:docker:x:0:1"
                .parse::<ScaledPool>()
                .unwrap_err()
                .to_string(),
            "`d:docker:x:0:1`: SLOTS is not a number; give DEPLOYMENT:KIND[+KIND...]:SLOTS:MIN:MAX, e.g. rb-reprobench-node-docker:docker:2:0:8"
        );
    }

    /// The watcher lists the node pods, then watches; a DELETED event releases that node's leases.
    #[tokio::test]
    async fn a_deleted_node_pod_reaches_the_core_as_a_gone_node() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            let (req, send) = handle.next_request().await.expect("list");
            assert_eq!(req.method(), http::Method::GET);
            assert_eq!(req.uri().path(), "/api/v1/namespaces/bench/pods");
            let query = req.uri().query().unwrap_or_default().to_string();
            assert!(
                query.contains("labelSelector=app.kubernetes.io%2Fcomponent%3Dnode"),
                "{query}"
            );
            assert!(!query.contains("watch=true"), "{query}");
            let list = serde_json::json!({"apiVersion": "v1", "kind": "PodList",
                "metadata": {"resourceVersion": "10"},
                "items": [pod("rb-node-docker-1", "Running"), pod("rb-node-docker-2", "Running")]});
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&list).unwrap(),
            )));
            let (req, send) = handle.next_request().await.expect("watch");
            let query = req.uri().query().unwrap_or_default().to_string();
            assert!(
                query.contains("watch=true") && query.contains("resourceVersion=10"),
                "{query}"
            );
            let mut deleted = pod("rb-node-docker-2", "Running");
            deleted.metadata.resource_version = Some("11".into());
            let event = serde_json::json!({"type": "DELETED", "object": deleted});
            let mut body = serde_json::to_vec(&event).unwrap();
            body.push(b'\n');
            send.send_response(Response::new(Body::from(body)));
            // The watcher watches again after the stream ends: leave that request unanswered.
            let _next = handle.next_request().await;
            std::future::pending::<()>().await;
        });
        let (core, commands) = CoreHandle::channel();
        let client = kube::Client::new(service, "bench");
        let watch = tokio::spawn(async move {
            watch_node_pods(client, "bench", "app.kubernetes.io/component=node", core).await
        });
        let got = tokio::task::spawn_blocking(move || {
            commands.recv_timeout(std::time::Duration::from_secs(30))
        })
        .await
        .unwrap()
        .expect("a command within 30 s");
        match got {
            Command::NodeGone { node_id, reason } => {
                assert_eq!(node_id, "rb-node-docker-2");
                assert!(reason.contains("was deleted"), "{reason}");
            }
            _ => panic!("expected NodeGone"),
        }
        watch.abort();
        server.abort();
    }

    #[test]
    fn costs_are_written_when_a_node_s_load_changes_and_again_when_it_comes_back() {
        let mut written = HashMap::new();
        let loads = |l: &[(&str, u64)]| -> Vec<(String, u64)> {
            l.iter().map(|(n, a)| (n.to_string(), *a)).collect()
        };
        let mut step = |l: &[(&str, u64)]| {
            let changes = cost_changes(&loads(l), &mut written);
            written.extend(changes.iter().cloned());
            changes
        };
        assert_eq!(
            step(&[("a", 0), ("b", 2)]),
            vec![("a".into(), 0), ("b".into(), 2)]
        );
        assert_eq!(step(&[("a", 0), ("b", 2)]), vec![]);
        assert_eq!(step(&[("a", 1)]), vec![("a".into(), 1)]);
        assert_eq!(step(&[("a", 1), ("b", 2)]), vec![("b".into(), 2)]);
        let labels: std::collections::BTreeMap<String, String> = [
            ("app.kubernetes.io/instance", "rb"),
            ("app.kubernetes.io/component", "node"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(selector_matches(
            "app.kubernetes.io/instance=rb,app.kubernetes.io/component=node",
            &labels
        ));
        assert!(!selector_matches(
            "app.kubernetes.io/component=coordinator",
            &labels
        ));
    }

    #[tokio::test]
    async fn the_coordinator_patches_node_pods_deletion_cost_and_nothing_else() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (patched_tx, mut patched) = tokio::sync::mpsc::unbounded_channel::<(String, String)>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((req, send)) = handle.next_request().await {
                let name = req.uri().path().rsplit('/').next().unwrap().to_string();
                let labels = if name == "rb-node-docker-1" {
                    serde_json::json!({"app.kubernetes.io/component": "node"})
                } else {
                    serde_json::json!({"app.kubernetes.io/component": "coordinator"})
                };
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": name, "labels": labels}});
                if req.method() == http::Method::PATCH {
                    let body = req.into_body().collect_bytes().await.unwrap();
                    let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let cost = patch["metadata"]["annotations"][DELETION_COST]
                        .as_str()
                        .unwrap();
                    let _ = patched_tx.send((name, cost.to_string()));
                } else {
                    assert_eq!(req.method(), http::Method::GET);
                }
                send.send_response(Response::new(Body::from(serde_json::to_vec(&pod).unwrap())));
            }
        });
        let (core, commands) = CoreHandle::channel();
        // The core's side: two connected nodes, one of them a node pod; its load goes 2, then 0.
        let answers = tokio::task::spawn_blocking(move || {
            let mut load = 2;
            while let Ok(command) = commands.recv_timeout(std::time::Duration::from_secs(30)) {
                if let Command::NodeLoads { reply } = command {
                    let _ = reply.send(vec![
                        ("rb-node-docker-1".to_string(), load),
                        ("rb-reprobench-coordinator-0".to_string(), 5),
                    ]);
                    load = 0;
                }
            }
        });
        let client = kube::Client::new(service, "bench");
        let keeper = tokio::spawn(async move {
            keep_deletion_costs(
                client,
                "bench",
                "app.kubernetes.io/component=node",
                core,
                Duration::from_millis(10),
            )
            .await
        });
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), patched.recv())
                .await
                .expect("a patch within 30 s")
                .unwrap()
        };
        assert_eq!(
            next().await,
            ("rb-node-docker-1".to_string(), "2".to_string())
        );
        assert_eq!(
            next().await,
            ("rb-node-docker-1".to_string(), "0".to_string())
        );
        keeper.abort();
        server.abort();
        drop(answers);
    }

    #[tokio::test]
    async fn the_scaler_reads_and_patches_the_deployment_scale_subresource() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            let (req, send) = handle.next_request().await.expect("get scale");
            assert_eq!(req.method(), http::Method::GET);
            assert_eq!(
                req.uri().path(),
                "/apis/apps/v1/namespaces/bench/deployments/rb-node-docker/scale"
            );
            let scale = serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": "rb-node-docker"}, "spec": {"replicas": 1}});
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&scale).unwrap(),
            )));
            let (req, send) = handle.next_request().await.expect("patch scale");
            assert_eq!(req.method(), http::Method::PATCH);
            assert_eq!(
                req.uri().path(),
                "/apis/apps/v1/namespaces/bench/deployments/rb-node-docker/scale"
            );
            assert_eq!(
                req.headers()[http::header::CONTENT_TYPE],
                "application/merge-patch+json"
            );
            let body = req.into_body().collect_bytes().await.unwrap();
            let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(patch, serde_json::json!({"spec": {"replicas": 3}}));
            let scale = serde_json::json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": "rb-node-docker"}, "spec": {"replicas": 3}});
            send.send_response(Response::new(Body::from(
                serde_json::to_vec(&scale).unwrap(),
            )));
        });
        let deployments: Api<Deployment> =
            Api::namespaced(kube::Client::new(service, "bench"), "bench");
        assert_eq!(replicas(&deployments, "rb-node-docker").await.unwrap(), 1);
        set_replicas(&deployments, "rb-node-docker", 3)
            .await
            .unwrap();
        server.await.unwrap();
    }
}
