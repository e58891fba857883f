//! Pending and running task counts per executor kind over plain HTTP, for autoscalers:
//! Prometheus text at `/metrics`, and KEDA's metrics-api JSON at `/keda?kinds=docker,process`.
//! No token: only counts are served, on a port of its own. Formatting is pure; [`serve`] is IO.

use crate::core::{Command, CoreHandle, KindCounts};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use std::collections::HashMap;
use std::net::SocketAddr;
use tokio::sync::oneshot;

/// Prometheus text exposition of the counts.
pub fn prometheus_text(counts: &[KindCounts]) -> String {
    let mut out = String::new();
    for (name, help, value) in [
        (
            "reprobench_tasks_pending",
            "Tasks waiting for a slot, per executor kind.",
            (|c: &KindCounts| c.pending) as fn(&KindCounts) -> u64,
        ),
        (
            "reprobench_tasks_running",
            "Tasks leased to a node, per executor kind.",
            |c: &KindCounts| c.running,
        ),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for c in counts {
            out.push_str(&format!(
                "{name}{{kind=\"{}\"}} {}\n",
                c.kind.as_str(),
                value(c)
            ));
        }
    }
    out
}

/// The counts summed over `kinds` (all kinds when empty), as KEDA's metrics-api scaler reads
/// them: `demand` (pending + running) is what a pool's replicas should cover.
pub fn keda_json(counts: &[KindCounts], kinds: &[String]) -> serde_json::Value {
    let (pending, running) = counts
        .iter()
        .filter(|c| kinds.is_empty() || kinds.iter().any(|k| k == c.kind.as_str()))
        .fold((0, 0), |(p, r), c| (p + c.pending, r + c.running));
    serde_json::json!({
        "kinds": kinds,
        "pending": pending,
        "running": running,
        "demand": pending + running,
    })
}

/// Asks the core for the counts.
pub async fn counts(core: &CoreHandle) -> Option<Vec<KindCounts>> {
    let (reply, rx) = oneshot::channel();
    core.send(Command::Counts { reply }).ok()?;
    rx.await.ok()
}

async fn metrics(State(core): State<CoreHandle>) -> Response {
    match counts(&core).await {
        Some(c) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            prometheus_text(&c),
        )
            .into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is stopping\n",
        )
            .into_response(),
    }
}

async fn keda(
    State(core): State<CoreHandle>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let kinds: Vec<String> = q
        .get("kinds")
        .map(|k| {
            k.split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    match counts(&core).await {
        Some(c) => axum::Json(keda_json(&c, &kinds)).into_response(),
        None => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the coordinator is stopping\n",
        )
            .into_response(),
    }
}

/// Serves the counts on `addr` until the process ends; returns the bound address.
pub async fn serve(addr: SocketAddr, core: CoreHandle) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/keda", get(keda))
        .with_state(core);
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "the metrics server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reprobench_domain::registry::ExecutorKind;

    fn counts() -> Vec<KindCounts> {
        vec![
            KindCounts {
                kind: ExecutorKind::Docker,
                pending: 5,
                running: 2,
            },
            KindCounts {
                kind: ExecutorKind::Sim,
                pending: 0,
                running: 1,
            },
        ]
    }

    #[test]
    fn prometheus_text_has_one_gauge_per_kind() {
        let text = prometheus_text(&counts());
        assert!(text.contains("# TYPE reprobench_tasks_pending gauge\n"));
        assert!(text.contains("reprobench_tasks_pending{kind=\"docker\"} 5\n"));
        assert!(text.contains("reprobench_tasks_running{kind=\"sim\"} 1\n"));
        assert_eq!(text.lines().filter(|l| !l.starts_with('#')).count(), 4);
    }

    #[test]
    fn keda_json_sums_the_kinds_asked_for() {
        let docker = keda_json(&counts(), &["docker".into()]);
        assert_eq!(
            (
                docker["pending"].as_u64(),
                docker["running"].as_u64(),
                docker["demand"].as_u64()
            ),
            (Some(5), Some(2), Some(7))
        );
        assert_eq!(keda_json(&counts(), &[])["demand"], 8);
        assert_eq!(keda_json(&counts(), &["emulator".into()])["demand"], 0);
    }
}
