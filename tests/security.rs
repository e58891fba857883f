//! Tokens and protocol versions: refused with clear statuses, and a refused node stops.

mod common;

use common::{Cluster, poll};
use reprobench_proto::auth::TokenInterceptor;
use reprobench_proto::v1::node_service_client::NodeServiceClient;
use reprobench_proto::v1::run_service_client::RunServiceClient;
use reprobench_proto::v1::{ListRunsRequest, RegisterRequest, SlotCount};
use std::time::Duration;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn channel(url: &str) -> Channel {
    Channel::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[test]
fn missing_or_wrong_tokens_are_unauthenticated() {
    let c = Cluster::start(2_000, 200);
    runtime().block_on(async {
        let ch = channel(&c.url).await;
        let err = RunServiceClient::new(ch.clone())
            .list_runs(ListRunsRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(
            err.message().contains("token"),
            "says where the token lives: {}",
            err.message()
        );
        let wrong = InterceptedService::new(ch.clone(), TokenInterceptor::new("not-the-token"));
        let err = RunServiceClient::new(wrong.clone())
            .list_runs(ListRunsRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let err = NodeServiceClient::new(wrong)
            .register(register(1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        let token = std::fs::read_to_string(c.token_file()).unwrap();
        let right = InterceptedService::new(ch, TokenInterceptor::new(token.trim()));
        assert!(
            RunServiceClient::new(right)
                .list_runs(ListRunsRequest {})
                .await
                .is_ok()
        );
    });
    // A node with a wrong token stops with an error instead of retrying forever.
    let bad = c.dir.path().join("bad-token");
    std::fs::write(&bad, "nope\n").unwrap();
    let mut node = std::process::Command::new(common::bin())
        .args([
            "node",
            "--coordinator",
            &c.url,
            "--token-file",
            bad.to_str().unwrap(),
            "--name",
            "intruder",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let status = poll(
        Duration::from_secs(30),
        "the refused node to exit",
        || c.logs(),
        || node.try_wait().unwrap(),
    );
    assert!(!status.success());
}

#[test]
fn a_protocol_version_mismatch_is_refused() {
    let c = Cluster::start(2_000, 200);
    let token = std::fs::read_to_string(c.token_file()).unwrap();
    runtime().block_on(async {
        let ch =
            InterceptedService::new(channel(&c.url).await, TokenInterceptor::new(token.trim()));
        let mut client = NodeServiceClient::new(ch);
        let err = client
            .register(register(reprobench_proto::PROTOCOL_VERSION + 1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition);
        assert!(err.message().contains("protocol"), "{}", err.message());
        let ok = client
            .register(register(reprobench_proto::PROTOCOL_VERSION))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ok.protocol_version, reprobench_proto::PROTOCOL_VERSION);
    });
}

fn register(version: u32) -> RegisterRequest {
    RegisterRequest {
        protocol_version: version,
        node_id: "probe".into(),
        hostname: "test".into(),
        slots: vec![SlotCount {
            kind: "synthetic".into(),
            slots: 1,
        }],
        binary_version: "test".into(),
    }
}

#[test]
fn a_tls_cluster_runs_and_plain_clients_are_told_what_to_pass() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let dir = tempfile::tempdir().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let ca = write("ca.pem", ca_cert.pem());
    let cert = write("cert.pem", leaf.pem());
    let key = write("key.pem", leaf_key.serialize_pem());

    let mut c = Cluster::start_with(
        dir,
        2_000,
        200,
        vec!["--tls-cert".into(), cert, "--tls-key".into(), key],
        vec!["--tls-ca".into(), ca],
    );
    assert!(c.url.starts_with("https://"), "{}", c.url);
    c.start_node("secure", "synthetic=2");
    let run = c.submit("synthetic:20:5");
    let s = c.wait_finished(&run, Duration::from_secs(60));
    assert_eq!(s["state"], "finished");
    common::assert_one_result_per_task(&c.results(&run), 20);

    // Without the CA, a client is refused before anything is sent, and told why.
    let token = c.token_file();
    let out = c.cli(&[
        "status",
        "--coordinator",
        &c.url,
        "--token-file",
        token.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-ca"));
}
