//! The backbone's API key reaches the upstream but is never written to a transcript.
//! Its own test binary: the environment variable is set before any other thread exists.

use reprobench_domain::sweep::{BackboneSpec, Price};
use reprobench_gateway::scripted::{ScriptedReply, ScriptedUpstream};
use reprobench_gateway::{Gateway, GatewayConfig, TaskBudget};
use serde_json::json;
use std::collections::BTreeMap;

const VAR: &str = "RB_GATEWAY_SECRET_TEST_API_KEY";
const SECRET: &str = "sk-test-5f1d0c9e-do-not-leak";

#[test]
fn api_key_reaches_upstream_but_no_transcript() {
    // SAFETY: this test binary holds this single test, and the variable is set before the
    // runtime (or any other thread) starts, so nothing reads the environment concurrently.
    unsafe { std::env::set_var(VAR, SECRET) };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        // The upstream echoes the Authorization header it saw, so the secret appears in a
        // response body the gateway records.
        let upstream = ScriptedUpstream::start(|req| {
            ScriptedReply::text(&format!("you sent {:?}", req.authorization))
        })
        .await;
        let dir = tempfile::tempdir().unwrap();
        let gw = Gateway::start(
            "127.0.0.1:0".parse().unwrap(),
            GatewayConfig {
                transcripts: Some(dir.path().to_path_buf()),
                ..GatewayConfig::default()
            },
        )
        .await
        .unwrap();
        let spec = BackboneSpec {
            name: "secret-backbone".into(),
            base_url: upstream.base_url(),
            model: "m".into(),
            api_key_env: Some(VAR.into()),
            price: Price::default(),
            params: BTreeMap::new(),
            max_concurrency: None,
            requests_per_minute: None,
            timeout_s: None,
            text_only: false,
        };
        let key = gw
            .open_task("secret", &spec, TaskBudget::default(), None)
            .unwrap();
        // An agent that pastes the key into its prompt must not leak it either.
        let body = json!({"model": "x", "messages": [
            {"role": "user", "content": format!("my key is {SECRET}")}]});
        let response = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("{}/chat/completions", gw.base_url()))
            .bearer_auth(&key)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        let requests = upstream.requests();
        assert_eq!(
            requests[0].authorization.as_deref(),
            Some(format!("Bearer {SECRET}").as_str())
        );
        gw.shutdown().await;

        let transcript = std::fs::read_to_string(dir.path().join("secret.jsonl")).unwrap();
        assert_eq!(transcript.lines().count(), 1);
        assert!(!transcript.contains(SECRET));
        assert!(transcript.contains("[redacted]"));
        assert!(!transcript.contains(&key));
    });
}
