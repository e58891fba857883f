//! A node running as a Kubernetes pod (`node --kubernetes`) keeps its own
//! `controller.kubernetes.io/pod-deletion-cost` annotation current: the number of attempts it
//! runs, so a scale-in removes idle pods first. It patches only its own pod (core/v1, served by
//! every server since 1.20; the cost is honoured from 1.22, behind a feature gate in 1.21).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use std::time::Duration;
use tokio::sync::watch;

/// The annotation the ReplicaSet controller reads when it picks pods to remove.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// The deletion cost of a pod running `running` attempts: 0 when idle, higher when busier.
pub fn deletion_cost(running: usize) -> i32 {
    i32::try_from(running).unwrap_or(i32::MAX)
}

/// Sets the pod's deletion cost.
pub async fn set_deletion_cost(pods: &Api<Pod>, pod: &str, cost: i32) -> kube::Result<()> {
    let patch =
        serde_json::json!({ "metadata": { "annotations": { DELETION_COST: cost.to_string() } } });
    pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Keeps `pod`'s deletion cost at the running count `running` reports, patching at most once per
/// `min_interval` (the latest count wins), until the node stops reporting.
pub async fn keep_deletion_cost(
    client: kube::Client,
    namespace: &str,
    pod: &str,
    mut running: watch::Receiver<usize>,
    min_interval: Duration,
) {
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let mut written: Option<i32> = None;
    loop {
        let cost = deletion_cost(*running.borrow_and_update());
        if written != Some(cost) {
            match set_deletion_cost(&pods, pod, cost).await {
                Ok(()) => written = Some(cost),
                Err(e) => tracing::warn!(pod, error = %e, "cannot update the pod's deletion cost"),
            }
        }
        tokio::time::sleep(min_interval).await;
        if written == Some(deletion_cost(*running.borrow())) && running.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use std::pin::pin;

    #[tokio::test]
    async fn the_pod_s_deletion_cost_follows_its_running_attempts() {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let (tx, rx) = watch::channel(0usize);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
        let server = tokio::spawn(async move {
            let mut handle = pin!(handle);
            while let Some((req, send)) = handle.next_request().await {
                assert_eq!(req.method(), http::Method::PATCH);
                assert_eq!(
                    req.uri().path(),
                    "/api/v1/namespaces/bench/pods/rb-node-docker-1"
                );
                assert_eq!(
                    req.headers()[http::header::CONTENT_TYPE],
                    "application/merge-patch+json"
                );
                let body = req.into_body().collect_bytes().await.unwrap();
                let patch: serde_json::Value = serde_json::from_slice(&body).unwrap();
                let cost = patch["metadata"]["annotations"][DELETION_COST]
                    .as_str()
                    .unwrap();
                let _ = seen_tx.send(cost.to_string());
                let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "rb-node-docker-1"}});
                send.send_response(Response::new(Body::from(serde_json::to_vec(&pod).unwrap())));
            }
        });
        let client = kube::Client::new(service, "bench");
        let keeper = tokio::spawn(async move {
            keep_deletion_cost(
                client,
                "bench",
                "rb-node-docker-1",
                rx,
                Duration::from_millis(10),
            )
            .await
        });
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), seen.recv())
                .await
                .expect("a patch within 30 s")
                .unwrap()
        };
        assert_eq!(next().await, "0", "idle at start");
        // Two changes in a row: the latest wins.
        tx.send_replace(1);
        tx.send_replace(2);
        assert_eq!(next().await, "2");
        tx.send_replace(0);
        assert_eq!(next().await, "0");
        drop(tx);
        tokio::time::timeout(Duration::from_secs(30), keeper)
            .await
            .expect("the keeper stops when the node stops reporting")
            .unwrap();
        server.abort();
    }
}
