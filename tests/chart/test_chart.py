"""charts/reprobench rendered with real Helm (helm-python-sdk, Helm v4's Go SDK), every object
validated strictly against Kubernetes' schemas (kubernetes-validate), and the objects that matter
checked for each values combination that matters. Run by tests/chart.rs."""

import copy
import json
import pathlib

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

CHART = pathlib.Path(__file__).resolve().parents[2] / "charts" / "reprobench"
# The oldest schemas kubernetes-validate ships, and the newest.
KUBE_VERSIONS = ["1.25", kubernetes_validate.utils.latest_version()]


def render(values=None, name="rb"):
    chart = helm.Chart.load(str(CHART))
    chart.validate_schema(values or {})
    out = chart.render(values or {}, name=name, namespace="bench", is_install=True)
    objects = []
    for path, text in out.items():
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(o for o in yaml.safe_load_all(text) if o)
    return objects, out


def find(objects, kind, name=None):
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return found


def one(objects, kind, name=None):
    found = find(objects, kind, name)
    assert len(found) == 1, f"{kind} {name}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(pod_spec, name):
    return next(c for c in pod_spec["containers"] if c["name"] == name)


def arg_after(args, flag):
    return args[args.index(flag) + 1]


EVERYTHING = {
    "pools": {
        "docker": {"docker": {"mode": "dind"}, "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 6}},
        "process": {"enabled": True},
        "emulator": {"enabled": True, "emulator": {"avd": "Pixel_6_API_33"}},
    },
    "backbones": {"apiKeys": [{"env": "OPENAI_API_KEY", "secretName": "openai", "secretKey": "api-key"}]},
    "nightly": {"enabled": True, "sweep": 'name = "nightly"\ndatasets = ["swt-mini"]\n', "baselineRun": "run-1", "maxDropPp": 2},
    "networkPolicy": {"clients": [{"namespaceSelector": {"matchLabels": {"team": "agents"}}}]},
}

COMBINATIONS = {
    "defaults": {},
    "everything": EVERYTHING,
    "pools-off": {"pools": {p: {"enabled": False} for p in ["docker", "process", "sim", "emulator"]}, "networkPolicy": {"enabled": False}},
    "existing-secret": {"token": {"existingSecret": "team-token", "key": "join"}},
    "builtin-scaler": {"autoscaling": {"engine": "builtin"}, "pools": {"docker": {"autoscaling": {"enabled": True, "maxReplicas": 3}}}},
    "no-kubernetes-api": {"kubernetes": {"enabled": False}, "metrics": {"enabled": False}},
    "tls-off": {"tls": {"enabled": False}},
    "tls-existing-secret": {"tls": {"existingSecret": "coordinator-cert"}},
    "tls-cert-manager": {"tls": {"certManager": {"issuerRef": {"name": "team-ca", "kind": "ClusterIssuer"}}}},
}

# Custom resources (KEDA's) have no schema in kubernetes-validate; their fields are checked below.
CUSTOM = {"keda.sh/v1alpha1", "cert-manager.io/v1"}


def test_lint_is_clean_in_strict_mode():
    report = helm.lint(str(CHART), strict=True)
    assert report["errors"] == []
    # Severity 1 is information ("icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(combination, kube_version):
    objects, _ = render(COMBINATIONS[combination])
    assert objects
    for o in objects:
        if o["apiVersion"] not in CUSTOM:
            kubernetes_validate.validate(o, kube_version, strict=True)


def test_the_coordinator_is_one_replica_on_a_read_write_once_volume():
    objects, _ = render()
    sts = one(objects, "StatefulSet")
    assert sts["spec"]["replicas"] == 1
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["accessModes"] == ["ReadWriteOnce"]
    pod = sts["spec"]["template"]["spec"]
    c = container(pod, "coordinator")
    assert c["args"][0] == "serve"
    assert arg_after(c["args"], "--data") == "/data"
    assert c["readinessProbe"]["tcpSocket"]["port"] == "grpc"
    assert c["livenessProbe"]["tcpSocket"]["port"] == "grpc"
    svc = one(objects, "Service")
    assert svc["spec"]["ports"][0]["port"] == 7077
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]


def test_the_token_secret_is_generated_and_kept_or_the_users():
    objects, _ = render()
    secret = one(objects, "Secret", "rb-reprobench-token")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(secret["data"]["token"]) > 60
    # The token is the admin credential: only the coordinator mounts it.
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in sts["volumes"]}
    assert vols["token"]["secret"]["secretName"] == secret["metadata"]["name"]
    for d in find(objects, "Deployment"):
        assert "token" not in {v["name"] for v in d["spec"]["template"]["spec"]["volumes"]}

    objects, _ = render(COMBINATIONS["existing-secret"])
    assert find(objects, "Secret", "rb-reprobench-token") == []
    spec = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["token"]["secret"]["secretName"] == "team-token"
    assert vols["token"]["secret"]["items"] == [{"key": "join", "path": "join"}]
    args = spec["containers"][0]["args"]
    assert arg_after(args, "--token-file") == "/var/run/reprobench/token/join"


def test_each_pool_presents_a_node_credential_of_its_own_and_the_nightly_job_a_client_one():
    objects, _ = render(EVERYTHING)
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    coordinator_args = container(sts, "coordinator")["args"]
    given = [coordinator_args[i + 1] for i, a in enumerate(coordinator_args) if a == "--credential"]
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "coordinator")["volumeMounts"]}
    coordinator_vols = {v["name"]: v for v in sts["volumes"]}
    for d in find(objects, "Deployment"):
        pool = d["metadata"]["labels"]["reprobench.dev/pool"]
        name = d["metadata"]["name"]
        secret = one(objects, "Secret", f"{name}-credential")
        assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        pod = d["spec"]["template"]["spec"]
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["credential"]["secret"]["secretName"] == secret["metadata"]["name"]
        assert arg_after(container(pod, "node")["args"], "--token-file") == "/var/run/reprobench/credential/token"
        # The coordinator knows it as the pool's: it acts only as pods named after the Deployment.
        path = f"/var/run/reprobench/credentials/{pool}/token"
        assert f"node:{name}-={path}" in given
        assert mounts[f"credential-{pool}"] == f"/var/run/reprobench/credentials/{pool}"
        assert coordinator_vols[f"credential-{pool}"]["secret"]["secretName"] == secret["metadata"]["name"]
    client = one(objects, "Secret", "rb-reprobench-client-credential")
    assert "client=/var/run/reprobench/credentials/client/token" in given
    job = one(objects, "CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in job["volumes"]}["credential"]["secret"]["secretName"] == client["metadata"]["name"]
    script = one(objects, "ConfigMap")["data"]["nightly.sh"]
    assert "--token-file /var/run/reprobench/credential/token" in script


def decoded_certificate(pem):
    """The fields of a PEM certificate, as Python's ssl module reads them."""
    import ssl
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(pem)
        f.flush()
        return ssl._ssl._test_decode_cert(f.name)


def assert_tls_handshake_verifies(secret, name):
    """A TLS server with the Secret's certificate and key, and a client trusting only its CA
    that checks `name`: the handshake succeeds (OpenSSL's verification)."""
    import base64
    import socket
    import ssl
    import tempfile
    import threading
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for key in ["tls.crt", "tls.key", "ca.crt"]:
            files[key] = pathlib.Path(d) / key
            files[key].write_bytes(base64.b64decode(secret["data"][key]))
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(files["tls.crt"], files["tls.key"])
        client = ssl.create_default_context(cafile=str(files["ca.crt"]))
        with socket.create_server(("127.0.0.1", 0)) as listener:
            port = listener.getsockname()[1]
            received = []

            def serve():
                conn, _ = listener.accept()
                with server.wrap_socket(conn, server_side=True) as s:
                    received.append(s.recv(1))

            t = threading.Thread(target=serve)
            t.start()
            with socket.create_connection(("127.0.0.1", port)) as raw:
                with client.wrap_socket(raw, server_hostname=name) as tls:
                    tls.sendall(b"x")
            t.join(10)
        assert received == [b"x"]


def test_tls_is_on_by_default_with_a_generated_ca_kept_across_upgrades():
    import base64
    objects, _ = render(EVERYTHING)
    secret = one(objects, "Secret", "rb-reprobench-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    cert = decoded_certificate(base64.b64decode(secret["data"]["tls.crt"]).decode())
    names = {v for k, v in cert["subjectAltName"] if k == "DNS"}
    assert names == {"rb-reprobench-coordinator", "rb-reprobench-coordinator.bench",
                     "rb-reprobench-coordinator.bench.svc", "rb-reprobench-coordinator.bench.svc.cluster.local"}
    ca = decoded_certificate(base64.b64decode(secret["data"]["ca.crt"]).decode())
    assert cert["issuer"] == ca["subject"]
    assert_tls_handshake_verifies(secret, "rb-reprobench-coordinator")
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    args = container(sts, "coordinator")["args"]
    assert arg_after(args, "--tls-cert") == "/var/run/reprobench/tls/tls.crt"
    assert arg_after(args, "--tls-key") == "/var/run/reprobench/tls/tls.key"
    # Nodes and the nightly job verify the coordinator with the CA alone (never its key).
    for d in find(objects, "Deployment"):
        pod = d["spec"]["template"]["spec"]
        node = container(pod, "node")
        assert arg_after(node["args"], "--coordinator").startswith("https://")
        assert arg_after(node["args"], "--tls-ca") == "/var/run/reprobench/tls/ca.crt"
        vols = {v["name"]: v for v in pod["volumes"]}
        assert vols["tls-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    script = one(objects, "ConfigMap")["data"]["nightly.sh"]
    assert "--coordinator https://rb-reprobench-coordinator:7077" in script
    assert "--tls-ca /var/run/reprobench/tls/ca.crt" in script

    # A Secret of the user's (cert-manager's): nothing generated, the same keys read.
    objects, _ = render({"tls": {"existingSecret": "coordinator-cert"}})
    assert find(objects, "Secret", "rb-reprobench-tls") == []
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in sts["volumes"]}["tls"]["secret"]["secretName"] == "coordinator-cert"

    # cert-manager when asked: a Certificate for the Service's names, whose Secret is the one read.
    objects, _ = render(COMBINATIONS["tls-cert-manager"])
    assert find(objects, "Secret", "rb-reprobench-tls") == []
    cert = one(objects, "Certificate")
    assert cert["apiVersion"] == "cert-manager.io/v1"
    assert cert["spec"]["secretName"] == "rb-reprobench-tls"
    assert cert["spec"]["issuerRef"] == {"name": "team-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    assert "rb-reprobench-coordinator.bench.svc" in cert["spec"]["dnsNames"]
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in sts["volumes"]}["tls"]["secret"]["secretName"] == "rb-reprobench-tls"

    # Off only when asked: plain http, no certificate flags.
    objects, _ = render({"tls": {"enabled": False}})
    assert find(objects, "Secret", "rb-reprobench-tls") == []
    assert "--tls-cert" not in container(one(objects, "StatefulSet")["spec"]["template"]["spec"], "coordinator")["args"]
    for d in find(objects, "Deployment"):
        node = container(d["spec"]["template"]["spec"], "node")
        assert arg_after(node["args"], "--coordinator").startswith("http://")
        assert "--tls-ca" not in node["args"]


def test_pools_are_one_deployment_each_with_their_slots_and_drain_time():
    objects, _ = render()
    names = sorted(d["metadata"]["name"] for d in find(objects, "Deployment"))
    assert names == ["rb-reprobench-node-docker", "rb-reprobench-node-sim"]
    docker = one(objects, "Deployment", "rb-reprobench-node-docker")["spec"]["template"]["spec"]
    node = container(docker, "node")
    assert arg_after(node["args"], "--slots") == "docker=2"
    assert arg_after(node["args"], "--coordinator") == "https://rb-reprobench-coordinator:7077"
    assert docker["terminationGracePeriodSeconds"] == 600 + 30
    # hostSocket: the host engine's socket, and a scratch directory at the same path on both sides.
    vols = {v["name"]: v for v in docker["volumes"]}
    assert vols["docker-socket"]["hostPath"]["path"] == "/var/run/docker.sock"
    env = {e["name"]: e.get("value") for e in node["env"]}
    assert vols["scratch"]["hostPath"]["path"] == env["TMPDIR"]
    assert [c["name"] for c in docker["containers"]] == ["node"]

    objects, _ = render(COMBINATIONS["pools-off"])
    assert find(objects, "Deployment") == []
    assert find(objects, "NetworkPolicy") == []
    assert len(find(objects, "StatefulSet")) == 1


def test_docker_in_docker_is_a_privileged_sidecar_the_node_reaches_over_mutual_tls():
    objects, _ = render(EVERYTHING)
    pod = one(objects, "Deployment", "rb-reprobench-node-docker")["spec"]["template"]["spec"]
    dind = container(pod, "dind")
    assert dind["securityContext"] == {"privileged": True}
    node = container(pod, "node")
    env = {e["name"]: e.get("value") for e in node["env"]}
    # The engine serves TLS on 2376 and checks client certificates; no plain 2375 anywhere.
    assert env["DOCKER_HOST"] == "tcp://127.0.0.1:2376"
    assert env["DOCKER_TLS_VERIFY"] == "1"
    dind_env = {e["name"]: e.get("value") for e in dind["env"]}
    assert dind_env["DOCKER_TLS_CERTDIR"] == "/certs"
    assert "2375" not in json.dumps(pod)
    # The node mounts only the client half of what the sidecar generates, read-only.
    certs = {m["name"]: m for m in node["volumeMounts"]}["dind-certs"]
    assert certs["mountPath"] == env["DOCKER_CERT_PATH"] == "/certs/client"
    assert certs["subPath"] == "client" and certs["readOnly"]
    assert {m["name"]: m["mountPath"] for m in dind["volumeMounts"]}["dind-certs"] == "/certs"
    assert "docker-socket" not in {v["name"] for v in pod["volumes"]}
    scratch = {m["name"]: m["mountPath"] for m in dind["volumeMounts"]}["scratch"]
    assert scratch == env["TMPDIR"] == {m["name"]: m["mountPath"] for m in node["volumeMounts"]}["scratch"]
    assert "privileged" not in node.get("securityContext", {})


def test_emulator_pods_request_the_device_resource_and_are_privileged_only_if_asked():
    objects, _ = render(EVERYTHING)
    pod = one(objects, "Deployment", "rb-reprobench-node-emulator")["spec"]["template"]["spec"]
    node = container(pod, "node")
    assert node["resources"]["limits"] == {"devices.kubevirt.io/kvm": 1}
    assert arg_after(node["args"], "--avd") == "Pixel_6_API_33"
    assert "securityContext" not in node
    asked = copy.deepcopy(EVERYTHING)
    asked["pools"]["emulator"]["emulator"].update({"privileged": True, "deviceResource": "example.com/kvm", "deviceCount": 2})
    asked["pools"]["emulator"]["resources"] = {"limits": {"memory": "8Gi"}}
    objects, _ = render(asked)
    node = container(one(objects, "Deployment", "rb-reprobench-node-emulator")["spec"]["template"]["spec"], "node")
    assert node["securityContext"] == {"privileged": True}
    assert node["resources"]["limits"] == {"example.com/kvm": 2, "memory": "8Gi"}


def test_an_emulator_pool_without_an_avd_is_refused_with_the_value_to_set():
    values = {"pools": {"emulator": {"enabled": True}}}
    with pytest.raises(Exception, match="pools.emulator.emulator.avd is required"):
        render(values)


def test_api_keys_come_only_from_the_secrets_named():
    objects, _ = render(EVERYTHING)
    for d in find(objects, "Deployment"):
        env = {e["name"]: e for e in container(d["spec"]["template"]["spec"], "node")["env"]}
        assert env["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "openai", "key": "api-key"}
        assert "value" not in env["OPENAI_API_KEY"]
        # The keys the chart hands a node are the only ones it lets a sweep use.
        args = container(d["spec"]["template"]["spec"], "node")["args"]
        assert arg_after(args, "--allow-key-env") == "OPENAI_API_KEY"
    objects, _ = render()
    for d in find(objects, "Deployment"):
        args = container(d["spec"]["template"]["spec"], "node")["args"]
        assert "--allow-key-env" not in args and "--allow-agent-commands" not in args


def test_network_policies_admit_the_release_and_named_clients_only():
    objects, _ = render(EVERYTHING)
    coord = one(objects, "NetworkPolicy", "rb-reprobench-coordinator")
    peers = coord["spec"]["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "rb"
    assert peers[1] == {"namespaceSelector": {"matchLabels": {"team": "agents"}}}
    nodes = one(objects, "NetworkPolicy", "rb-reprobench-nodes")
    assert nodes["spec"]["ingress"] == []
    assert set(nodes["spec"]["policyTypes"]) == {"Ingress", "Egress"}


def test_disruption_budgets_follow_the_pools_that_ask_for_them():
    objects, _ = render(EVERYTHING)
    pdbs = sorted(p["metadata"]["name"] for p in find(objects, "PodDisruptionBudget"))
    # sim's is off by default.
    assert pdbs == ["rb-reprobench-node-docker", "rb-reprobench-node-emulator", "rb-reprobench-node-process"]
    for p in find(objects, "PodDisruptionBudget"):
        assert p["apiVersion"] == "policy/v1"


def test_the_nightly_job_submits_waits_and_compares_with_the_baseline():
    objects, _ = render(EVERYTHING)
    cron = one(objects, "CronJob")
    assert cron["apiVersion"] == "batch/v1"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 0
    config = one(objects, "ConfigMap")
    script = config["data"]["nightly.sh"]
    assert "reprobench run /etc/reprobench/nightly/sweep.toml" in script
    assert 'reprobench results "run-1"' in script
    assert "reprobench compare --results /tmp/new.jsonl --baseline /tmp/baseline.jsonl --max-drop 2" in script
    assert config["data"]["sweep.toml"].startswith('name = "nightly"')
    objects, _ = render()
    assert find(objects, "CronJob") == []


def test_agent_commands_never_run_where_a_docker_engine_is_reachable():
    for mode in ["hostSocket", "dind"]:
        with pytest.raises(Exception, match="Docker engine"):
            render({"pools": {"docker": {"docker": {"mode": mode}, "extraArgs": ["--allow-agent-commands"]}}})
    # A process pool may allow them (it has no engine).
    objects, _ = render({"pools": {"process": {"enabled": True, "extraArgs": ["--allow-agent-commands"]}}})
    node = container(one(objects, "Deployment", "rb-reprobench-node-process")["spec"]["template"]["spec"], "node")
    assert "--allow-agent-commands" in node["args"]


def test_the_schema_rejects_mistyped_values():
    for bad in [
        {"pools": {"docker": {"slots": {"dockr": 1}}}},
        {"coordinator": {"prot": 7077}},
        {"pools": {"docker": {"docker": {"mode": "socket"}}}},
        {"backbones": {"apiKeys": [{"env": "OPENAI_API_KEY", "secretName": "openai"}]}},
    ]:
        with pytest.raises(Exception):
            render(bad)


def rules_of(objects, role):
    return one(objects, "Role", role)["rules"]


def test_rbac_is_what_the_kubernetes_code_calls_and_no_more():
    objects, _ = render()
    assert rules_of(objects, "rb-reprobench-coordinator") == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]}
    ]
    # Node pods, where agent code may run, hold no cluster credentials at all.
    assert [r["metadata"]["name"] for r in find(objects, "Role")] == ["rb-reprobench-coordinator"]
    assert [b["metadata"]["name"] for b in find(objects, "RoleBinding")] == ["rb-reprobench-coordinator"]
    sts = one(objects, "StatefulSet")["spec"]["template"]["spec"]
    assert sts["serviceAccountName"] == "rb-reprobench-coordinator"
    args = container(sts, "coordinator")["args"]
    assert "--kubernetes" in args
    assert arg_after(args, "--node-pod-selector") == "app.kubernetes.io/instance=rb,app.kubernetes.io/component=node"
    for d in find(objects, "Deployment"):
        pod = d["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "rb-reprobench-node"
        node = container(pod, "node")
        assert "--kubernetes" not in node["args"]
        assert arg_after(node["args"], "--name") == "$(POD_NAME)"
    accounts = {a["metadata"]["name"]: a for a in find(objects, "ServiceAccount")}
    assert accounts["rb-reprobench-coordinator"]["automountServiceAccountToken"] is True
    assert accounts["rb-reprobench-node"]["automountServiceAccountToken"] is False

    # The built-in scaler adds the scale subresource, and nothing more.
    objects, _ = render(COMBINATIONS["builtin-scaler"])
    assert rules_of(objects, "rb-reprobench-coordinator")[1] == {
        "apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]
    }
    args = container(one(objects, "StatefulSet")["spec"]["template"]["spec"], "coordinator")["args"]
    assert arg_after(args, "--scale") == "rb-reprobench-node-docker:docker:2:0:3"
    assert arg_after(args, "--scale-down-delay-s") == "300"
    assert find(objects, "ScaledObject") == []
    # A scaled pool's replicas are the scaler's, not the chart's.
    assert "replicas" not in one(objects, "Deployment", "rb-reprobench-node-docker")["spec"]

    # Without the Kubernetes API: no roles, no tokens mounted, no flags.
    objects, _ = render(COMBINATIONS["no-kubernetes-api"])
    assert find(objects, "Role") == [] and find(objects, "RoleBinding") == []
    assert all(a["automountServiceAccountToken"] is False for a in find(objects, "ServiceAccount"))
    for o in find(objects, "StatefulSet") + find(objects, "Deployment"):
        assert "--kubernetes" not in o["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--metrics-listen" not in o["spec"]["template"]["spec"]["containers"][0]["args"]


def test_keda_scales_a_pool_from_the_coordinator_counts_of_its_kinds():
    objects, _ = render(EVERYTHING)
    so = one(objects, "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert so["metadata"]["name"] == so["spec"]["scaleTargetRef"]["name"] == "rb-reprobench-node-docker"
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 6)
    trigger = so["spec"]["triggers"][0]
    assert trigger["type"] == "metrics-api"
    assert trigger["metadata"] == {
        "url": "http://rb-reprobench-coordinator:9090/keda?kinds=docker",
        "valueLocation": "demand",
        "targetValue": "2",
    }
    assert "replicas" not in one(objects, "Deployment", "rb-reprobench-node-docker")["spec"]
    # Only that pool scales; the others keep their replicas.
    assert one(objects, "Deployment", "rb-reprobench-node-sim")["spec"]["replicas"] == 1
    svc = one(objects, "Service")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 7077, "metrics": 9090}
    # KEDA's namespace may read the metrics port, not the gRPC one.
    coord = one(objects, "NetworkPolicy", "rb-reprobench-coordinator")["spec"]["ingress"]
    metrics_rule = next(r for r in coord if r["ports"][0]["port"] == 9090)
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}} in metrics_rule["from"]
    grpc_rule = next(r for r in coord if r["ports"][0]["port"] == 7077)
    assert all("keda" not in str(p) for p in grpc_rule["from"])
    objects, _ = render()
    assert find(objects, "ScaledObject") == []
