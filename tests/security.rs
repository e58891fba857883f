//! Tokens and protocol versions: refused with clear statuses, and a refused node stops.

mod common;

use common::{Cluster, poll};
use reprobench_proto::auth::TokenInterceptor;
use reprobench_proto::v1::node_service_client::NodeServiceClient;
use reprobench_proto::v1::run_service_client::RunServiceClient;
use reprobench_proto::v1::{
    CancelRunRequest, ListRunsRequest, RegisterRequest, SlotCount, SubmitRunRequest,
};
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
fn a_protocol_version_mismatch_or_an_unknown_kind_is_refused() {
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
        // Slots of a kind this coordinator does not know (a newer node's) are refused by name.
        let mut unknown = register(reprobench_proto::PROTOCOL_VERSION);
        unknown.slots[0].kind = "gpu".into();
        let err = client.register(unknown).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains("`gpu`") && err.message().contains("synthetic"),
            "{}",
            err.message()
        );
        let ok = client
            .register(register(reprobench_proto::PROTOCOL_VERSION))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ok.protocol_version, reprobench_proto::PROTOCOL_VERSION);
    });
}

/// Names that become directories (instance ids, agent, variant and backbone names) are refused
/// at submission, over the protocol, with the row or field and the rule; no run is created.
#[test]
fn names_that_could_escape_their_directories_are_refused() {
    let c = Cluster::start(2_000, 200);
    runtime().block_on(async {
        let token = std::fs::read_to_string(c.token_file()).unwrap();
        let ch = channel(&c.url).await;
        let mut client =
            RunServiceClient::new(InterceptedService::new(ch, TokenInterceptor::new(token.trim())));
        let row = |id: &str| {
            serde_json::json!({"instance_id": id, "repo": "o/r", "base_commit": "abc"}).to_string()
        };
        let swt = |agent: &str, extra: &str, id: &str| SubmitRunRequest {
            sweep_toml: format!(
                "name = \"s\"\ndatasets = [\"mini\"]\n[[agents]]\nname = \"{agent}\"\n{extra}"
            ),
            attachments: [("dataset:mini".to_string(), row(id) + "\n")].into(),
            ..Default::default()
        };
        let android = SubmitRunRequest {
            sweep_toml: "name = \"s\"\ndatasets = [\"sim\"]\n[[agents]]\nname = \"monkey\"\n"
                .into(),
            attachments: [(
                "android:sim".to_string(),
                serde_json::json!({"instance_id": "/abs", "app": "a", "bug_type": "crash"})
                    .to_string(),
            )]
            .into(),
            ..Default::default()
        };
        let cases = [
            (swt("gold", "", "../../escape"), "`../../escape`"),
            (swt("gold", "", ".hidden"), "`.hidden`"),
            (swt("gold", "", "a\u{0}b"), "instance_id"),
            (swt("../gold", "", "ok-1"), "agent name"),
            (swt("gold", "variants = [\"a/b\"]", "ok-1"), "variant"),
            (
                swt(
                    "x",
                    "[[backbones]]\nname = \"..\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"",
                    "ok-1",
                ),
                "backbone name",
            ),
            (android, "`/abs`"),
        ];
        for (request, named) in cases {
            let err = client.submit_run(request).await.unwrap_err();
            assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
            assert!(err.message().contains(named), "{named}: {}", err.message());
        }
        let runs = client.list_runs(ListRunsRequest {}).await.unwrap().into_inner();
        assert!(runs.runs.is_empty(), "no run was created: {runs:?}");
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
        session: String::new(),
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

    // --tls-server-name: the name checked is the one given (a port-forward, a pod's IP), not
    // the URL's host; a name the certificate does not carry is refused.
    let ca = c.client_args[1].clone();
    let status_as = |name: &str| {
        c.cli(&[
            "status",
            "--coordinator",
            &c.url,
            "--token-file",
            token.to_str().unwrap(),
            "--tls-ca",
            &ca,
            "--tls-server-name",
            name,
        ])
        .status
        .success()
    };
    assert!(status_as("localhost"));
    assert!(!status_as("coordinator.elsewhere.example"));
}

/// A node started without `--allow-*` flags runs no agent command and no environment command a
/// sweep supplies, reads no key the node did not declare, and calls no plain-http host but its
/// own; each such task ends errored, saying which flag would allow it. Over the real protocol,
/// with a real node process that holds the canary key in its environment.
#[test]
fn a_node_runs_no_sweep_supplied_code_and_sends_no_undeclared_key() {
    let mut c = Cluster::start(2_000, 200);
    let canary_dir = tempfile::tempdir().unwrap();
    let touched = canary_dir.path().join("pwned");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    c.start_node_with(
        "strict",
        "process=1",
        &[],
        &[("RB_CANARY_SECRET", "canary-value-that-must-stay")],
    );
    let touch = format!("touch {}", touched.display());
    // A command agent, and a built-in LLM agent whose backbones want an undeclared key and a
    // plain-http host elsewhere.
    let hostile = format!(
        "name = \"hostile\"\ndatasets = [\"swt-mini\"]\n[eval]\nexecutor = \"process\"\n\
         [[agents]]\nname = \"x\"\ncommand = [\"sh\", \"-c\", \"{touch}\"]\n\
         [[agents]]\nname = \"zero-shot-plus\"\n\
         [[backbones]]\nname = \"keyed\"\nbase_url = \"http://127.0.0.1:{port}/v1\"\nmodel = \"m\"\napi_key_env = \"RB_CANARY_SECRET\"\n\
         [[backbones]]\nname = \"elsewhere\"\nbase_url = \"http://10.255.255.1:9/v1\"\nmodel = \"m\"\n"
    );
    // A dataset whose environment installs with a command of its own.
    let mini = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("datasets/swt-mini");
    let own = c.dir.path().join("mini-own-env");
    std::fs::create_dir_all(&own).unwrap();
    let rows = std::fs::read_to_string(mini.join("instances.jsonl")).unwrap();
    std::fs::write(own.join("instances.jsonl"), rows.lines().next().unwrap()).unwrap();
    let mut env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(mini.join("env.json")).unwrap()).unwrap();
    for versions in env.as_object_mut().unwrap().values_mut() {
        for spec in versions.as_object_mut().unwrap().values_mut() {
            spec["install"] = touch.clone().into();
        }
    }
    std::fs::write(own.join("env.json"), env.to_string()).unwrap();
    std::fs::write(
        own.join("manifest.json"),
        r#"{"name": "mini-own-env", "track": "swt", "instances": "instances.jsonl", "env": "env.json"}"#,
    )
    .unwrap();
    let own_env = format!(
        "name = \"own-env\"\ndatasets = [\"{}\"]\n[eval]\nexecutor = \"process\"\n[[agents]]\nname = \"gold\"\n",
        own.display()
    );
    let mut refusals = std::collections::BTreeMap::<String, usize>::new();
    for (name, toml) in [("hostile", hostile), ("own-env", own_env)] {
        let run = c.submit_sweep(name, &toml);
        let status = c.wait_finished(&run, Duration::from_secs(120));
        let rows = c.results(&run);
        assert!(!rows.is_empty());
        assert_eq!(
            status["errored"].as_u64(),
            Some(rows.len() as u64),
            "{status}"
        );
        for r in &rows {
            let class = r["error_class"].as_str().unwrap_or_default().to_string();
            let message = r["error_message"].as_str().unwrap_or_default();
            let flag = match class.as_str() {
                "not_allowed:agent_command" => "--allow-agent-commands",
                "not_allowed:env_commands" => "--allow-env-commands",
                "not_allowed:backbone" if r["backbone"] == "keyed" => {
                    "--allow-key-env RB_CANARY_SECRET"
                }
                "not_allowed:backbone" => "--allow-http-host 10.255.255.1",
                other => panic!("unexpected error class `{other}`: {r}"),
            };
            assert!(message.contains(flag), "{flag}: {message}");
            *refusals.entry(flag.to_string()).or_default() += 1;
        }
    }
    assert_eq!(refusals.len(), 4, "every way in was tried: {refusals:?}");
    assert!(
        !touched.exists(),
        "a sweep-supplied command ran on the node"
    );
    assert!(
        listener.accept().is_err(),
        "the node called the sweep's backbone with an undeclared key"
    );
}

/// A second process under the name of a connected node is refused, naming the node and its
/// host, instead of silently taking over its stream and leases.
#[test]
fn a_second_node_under_a_connected_nodes_name_is_refused() {
    let mut c = Cluster::start(2_000, 200);
    c.start_node("twin", "synthetic=1");
    runtime().block_on(async {
        let token = std::fs::read_to_string(c.token_file()).unwrap();
        let ch = channel(&c.url).await;
        let authed = InterceptedService::new(ch, TokenInterceptor::new(token.trim()));
        let mut runs = RunServiceClient::new(authed.clone());
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while runs
            .list_runs(ListRunsRequest {})
            .await
            .unwrap()
            .into_inner()
            .live_nodes
            == 0
        {
            assert!(std::time::Instant::now() < deadline, "{}", c.logs());
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let mut req = register(reprobench_proto::PROTOCOL_VERSION);
        req.node_id = "twin".into();
        req.session = "another-process".into();
        let err = NodeServiceClient::new(authed)
            .register(req)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists, "{}", err.message());
        assert!(err.message().contains("`twin`"), "{}", err.message());
    });
}

/// Makes a credential with `reprobench credential add` on the coordinator's data directory;
/// returns its token.
fn add_credential(c: &Cluster, args: &[&str]) -> String {
    let data = c.data();
    let mut all = vec!["credential", "add", "--data", data.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = c.cli(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The id `reprobench credential list` shows for the credential labelled `label`.
fn credential_id(c: &Cluster, label: &str) -> String {
    let data = c.data();
    let out = c.cli(&["credential", "list", "--data", data.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.ends_with(label))
        .unwrap_or_else(|| panic!("no credential labelled {label}: {text}"));
    line.split_whitespace().next().unwrap().to_string()
}

/// Revokes the credential labelled `label` with `reprobench credential revoke`.
fn revoke_credential(c: &Cluster, label: &str) {
    let id = credential_id(c, label);
    let data = c.data();
    let out = c.cli(&[
        "credential",
        "revoke",
        &id,
        "--data",
        data.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Credentials per role over the real protocol: a client credential is not a node, a node
/// credential acts only as the node it binds and cannot use runs, a client cancels only its
/// own runs while an admin cancels any, and a revoked credential is refused.
#[test]
fn each_credential_does_only_what_its_role_allows() {
    let c = Cluster::start(2_000, 200);
    let alice = add_credential(&c, &["--role", "client", "--label", "alice"]);
    let bob = add_credential(&c, &["--role", "client", "--label", "bob"]);
    let node_x = add_credential(&c, &["--role", "node", "--node", "node-x"]);
    let admin = std::fs::read_to_string(c.token_file()).unwrap();
    let version = reprobench_proto::PROTOCOL_VERSION;
    let sweep = "name='t'\ndatasets=['synthetic:3:60000']\n[[agents]]\nname='synthetic'\n";
    runtime().block_on(async {
        let ch = channel(&c.url).await;
        let with = |t: &str| InterceptedService::new(ch.clone(), TokenInterceptor::new(t.trim()));
        // A client credential used as a node.
        let err = NodeServiceClient::new(with(&alice))
            .register(register(version))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
        assert!(err.message().contains("--role node"), "{}", err.message());
        // A node credential acting for another node, then as itself.
        let mut as_other = register(version);
        as_other.node_id = "node-y".into();
        let err = NodeServiceClient::new(with(&node_x))
            .register(as_other)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
        assert!(err.message().contains("node-x"), "{}", err.message());
        let mut as_itself = register(version);
        as_itself.node_id = "node-x".into();
        NodeServiceClient::new(with(&node_x))
            .register(as_itself)
            .await
            .unwrap();
        // A node credential cannot submit, list or read runs.
        let err = RunServiceClient::new(with(&node_x))
            .list_runs(ListRunsRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
        let submit = |token: String| async move {
            RunServiceClient::new(with(&token))
                .submit_run(SubmitRunRequest {
                    sweep_toml: sweep.into(),
                    ..Default::default()
                })
                .await
                .map(|r| r.into_inner().run_id)
        };
        let err = submit(node_x.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        // Alice's run: Bob may not cancel it, Alice may.
        let run = submit(alice.clone()).await.unwrap();
        let cancel = |token: String, run_id: String| async move {
            RunServiceClient::new(with(&token))
                .cancel_run(CancelRunRequest { run_id })
                .await
        };
        let err = cancel(bob.clone(), run.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied, "{}", err.message());
        cancel(alice.clone(), run).await.unwrap();
        // Bob's run: the admin may cancel it.
        let run = submit(bob.clone()).await.unwrap();
        cancel(admin.clone(), run).await.unwrap();
    });
    // Revoked: refused from then on, saying so.
    revoke_credential(&c, "alice");
    runtime().block_on(async {
        let ch = channel(&c.url).await;
        let err = RunServiceClient::new(InterceptedService::new(ch, TokenInterceptor::new(&alice)))
            .list_runs(ListRunsRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{}", err.message());
        assert!(err.message().contains("revoked"), "{}", err.message());
    });
}

/// A node's credential revoked while it works: its stream is closed and it stops, instead of
/// working on with a credential no longer valid.
#[test]
fn a_node_whose_credential_is_revoked_is_disconnected() {
    let mut c = Cluster::start(2_000, 200);
    let token = add_credential(&c, &["--role", "node", "--node", "node-r", "--label", "r"]);
    let file = c.dir.path().join("node-r.token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    c.start_node_presenting("node-r", "synthetic=1", &file, &[], &[]);
    let admin = std::fs::read_to_string(c.token_file()).unwrap();
    let live_nodes = || {
        runtime().block_on(async {
            let ch = channel(&c.url).await;
            RunServiceClient::new(InterceptedService::new(
                ch,
                TokenInterceptor::new(admin.trim()),
            ))
            .list_runs(ListRunsRequest {})
            .await
            .unwrap()
            .into_inner()
            .live_nodes
        })
    };
    poll(
        Duration::from_secs(30),
        "the node to connect",
        || c.logs(),
        || (live_nodes() == 1).then_some(()),
    );
    revoke_credential(&c, "r");
    let logs = c.dir.path().to_path_buf();
    let status = poll(
        Duration::from_secs(30),
        "the revoked node to stop",
        || common::logs_in(&logs),
        || c.node_mut("node-r").try_wait().unwrap(),
    );
    assert!(!status.success());
}

/// A data directory from before credentials: its join token keeps working, as the admin
/// credential, and other credentials can then be made.
#[test]
fn a_data_directory_with_a_join_token_upgrades_to_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("token"), "a-join-token-from-before-0123456789\n").unwrap();
    let c = Cluster::start_with(dir, 2_000, 200, vec![], vec![]);
    assert!(data.join("credentials.json").exists());
    runtime().block_on(async {
        let ch = channel(&c.url).await;
        let old = InterceptedService::new(
            ch,
            TokenInterceptor::new("a-join-token-from-before-0123456789"),
        );
        RunServiceClient::new(old.clone())
            .list_runs(ListRunsRequest {})
            .await
            .unwrap();
        NodeServiceClient::new(old)
            .register(register(reprobench_proto::PROTOCOL_VERSION))
            .await
            .unwrap();
    });
    let client = add_credential(&c, &["--role", "client"]);
    assert!(client.starts_with("rb-client-"));
}

/// A sweep larger than the coordinator takes is refused before it is expanded, over the
/// protocol, naming the limit and the flag; nothing is created.
#[test]
fn a_sweep_over_the_task_limit_is_refused_naming_the_flag() {
    let c = Cluster::start_with(
        tempfile::tempdir().unwrap(),
        2_000,
        200,
        vec!["--max-sweep-tasks".into(), "100".into()],
        vec![],
    );
    let token = std::fs::read_to_string(c.token_file()).unwrap();
    runtime().block_on(async {
        let ch = channel(&c.url).await;
        let mut runs = RunServiceClient::new(InterceptedService::new(
            ch,
            TokenInterceptor::new(token.trim()),
        ));
        let sweep = |tasks: u32, repeats: u32| SubmitRunRequest {
            sweep_toml: format!(
                "name='big'\ndatasets=['synthetic:{tasks}:1000']\nrepeats={repeats}\n[[agents]]\nname='synthetic'\n"
            ),
            ..Default::default()
        };
        let err = runs.submit_run(sweep(60, 2)).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
        assert!(err.message().contains("120 tasks"), "{}", err.message());
        assert!(err.message().contains("--max-sweep-tasks"), "{}", err.message());
        let listed = runs.list_runs(ListRunsRequest {}).await.unwrap().into_inner();
        assert!(listed.runs.is_empty(), "{listed:?}");
        // At the limit: taken.
        runs.submit_run(sweep(50, 2)).await.unwrap();
    });
}

/// A submission larger than the coordinator's message limit is refused, and the client says
/// which flag raises it; the coordinator keeps serving and takes a submission under the limit.
#[test]
fn a_submission_over_the_message_limit_is_refused_naming_the_flag() {
    let c = Cluster::start_with(
        tempfile::tempdir().unwrap(),
        2_000,
        200,
        vec!["--max-message-mib".into(), "1".into()],
        vec![],
    );
    let sweep = c.dir.path().join("large.toml");
    // A sweep file of 2 MiB (a long comment) travels whole in the submission.
    let padding = format!("# {}\n", "x".repeat(2 << 20));
    std::fs::write(
        &sweep,
        format!(
            "{padding}name='large'\ndatasets=['synthetic:2:1']\n[[agents]]\nname='synthetic'\n"
        ),
    )
    .unwrap();
    let token = c.token_file();
    let out = c.cli(&[
        "run",
        sweep.to_str().unwrap(),
        "--coordinator",
        &c.url,
        "--token-file",
        token.to_str().unwrap(),
        "--detach",
    ]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("--max-message-mib"), "{said}");
    // Under the limit: taken by the same coordinator.
    c.submit("synthetic:2:1");
}

/// Certificates as the `docker:dind` entrypoint makes them: a CA, a server certificate for
/// 127.0.0.1, and a client certificate, each with its extended key usage.
struct DockerTlsFiles {
    ca: rcgen::Certificate,
    server: (rcgen::Certificate, rcgen::KeyPair),
}

fn docker_tls_files(dir: &std::path::Path) -> DockerTlsFiles {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf = |names: Vec<String>, usage: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![usage];
        (params.signed_by(&key, &issuer).unwrap(), key)
    };
    let server = leaf(
        vec!["127.0.0.1".into(), "localhost".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client, client_key) = leaf(vec![], ExtendedKeyUsagePurpose::ClientAuth);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), client.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), client_key.serialize_pem()).unwrap();
    DockerTlsFiles { ca, server }
}

/// A Docker engine reached over mutual TLS (the chart's dind mode): the node's Docker client
/// follows DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, and an engine that checks client
/// certificates refuses one from another CA. The engine is this machine's, behind a TLS front
/// that checks client certificates as dockerd's --tlsverify does (no dind image here).
#[test]
fn the_docker_engine_is_reached_over_mutual_tls_and_a_foreign_client_is_refused() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio_rustls::rustls;
    if !common::docker_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("certs");
    let files = docker_tls_files(&good);
    // A client certificate of another CA, with that CA: what an intruder could make.
    let foreign = dir.path().join("foreign");
    docker_tls_files(&foreign);
    std::fs::copy(good.join("ca.pem"), foreign.join("ca.pem")).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(files.ca.der().clone()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        files.server.1.serialize_der(),
    ));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(vec![files.server.0.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let verified = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    // The front serves on worker threads while this thread waits on the client processes.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    {
        let (verified, refused) = (verified.clone(), refused.clone());
        rt.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let (acceptor, verified, refused) =
                    (acceptor.clone(), verified.clone(), refused.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        refused.fetch_add(1, Ordering::SeqCst);
                        return;
                    };
                    verified.fetch_add(1, Ordering::SeqCst);
                    let Ok(mut engine) =
                        tokio::net::UnixStream::connect("/var/run/docker.sock").await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut engine).await;
                });
            }
        });
    }
    // `images bootstrap` of an image the engine has: it asks the engine and builds nothing.
    let ask_engine = |certs: &std::path::Path| {
        std::process::Command::new(common::bin())
            .args([
                "images",
                "bootstrap",
                "--tag",
                "reprobench/python-base:bookworm-2",
            ])
            .env("DOCKER_HOST", format!("tcp://127.0.0.1:{port}"))
            .env("DOCKER_TLS_VERIFY", "1")
            .env("DOCKER_CERT_PATH", certs)
            .output()
            .unwrap()
    };
    let out = ask_engine(&good);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(verified.load(Ordering::SeqCst) >= 1);
    let before = verified.load(Ordering::SeqCst);
    let out = ask_engine(&foreign);
    assert!(
        !out.status.success(),
        "a foreign client certificate was served"
    );
    // The front counts its refusal after it has sent the alert, so the client may exit first.
    poll(
        Duration::from_secs(10),
        "the TLS front to count the foreign client's refusal",
        String::new,
        || (refused.load(Ordering::SeqCst) >= 1).then_some(()),
    );
    assert_eq!(verified.load(Ordering::SeqCst), before);
}
