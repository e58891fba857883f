"""A real single-node Kubernetes cluster on loopback, the chart installed into it, and a sweep run
through the coordinator pod while a node pod is killed. Run by tests/k8s/e2e.sh, which builds the
binaries; see there. Prints progress on stderr and, with --json, one JSON object last on stdout.

The cluster: etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager, kube-scheduler,
kube-proxy (iptables) and a kubelet whose dockershim drives this machine's Docker engine; pods get
Docker's bridge network. There is no CoreDNS: a dnsmasq on the bridge's gateway answers for the
cluster's Services, from a hosts directory this script keeps equal to the API's Services (the part
of CoreDNS's job the chart needs: nodes reach the coordinator by its Service name). dnsmasq reads
that directory again by itself when a file in it changes (inotify); no signal is sent to it, since
a SIGHUP that arrives before dnsmasq has set up its handlers kills it.
"""

import argparse
import base64
import json
import os
import pathlib
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "reprobench"
GATEWAY = "172.17.0.1"  # docker0: the API server, DNS and the host as pods see them
ETCD_PORT, ETCD_PEER_PORT, API_PORT = 23791, 23801, 16443
RELEASE, NAMESPACE, NODE = "rb", "default", "node1"
PAUSE_IMAGE = "reprobench-e2e/pause:1"


def log(msg):
    print(f"[k8s-e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, **kw):
    """Runs cmd, returns stdout; a failure raises with its stderr."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stderr}{p.stdout}")
    return p.stdout


def wait_for(what, check, timeout_s, every_s=0.5):
    """Polls check() until it returns a truthy value, or fails naming what it waited for."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            v = check()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - keep polling, report the last error
            last = e
        time.sleep(every_s)
    raise RuntimeError(f"timed out after {timeout_s} s waiting for {what}" + (f": {last}" if last else ""))


class Cluster:
    """The control plane and the kubelet as child processes of this script, in a work directory."""

    def __init__(self, work, bindir):
        self.work = pathlib.Path(work)
        self.bin = pathlib.Path(bindir)
        self.procs = {}
        self.kubeconfig = self.work / "kubeconfig"
        self.hosts_dir = self.work / "svc-hosts.d"
        self._stop = threading.Event()

    # --- setup -----------------------------------------------------------------------------

    def certificates(self):
        w = self.work
        run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-keyout", w / "ca.key", "-out", w / "ca.crt", "-subj", "/CN=reprobench-e2e-ca"])
        sans = ",".join([
            "IP:127.0.0.1", f"IP:{GATEWAY}", "IP:10.96.0.1", "DNS:kubernetes",
            "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ])
        (w / "server.ext").write_text(
            f"basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
        run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", w / "server.key",
             "-out", w / "server.csr", "-subj", "/CN=kube-apiserver"])
        run(["openssl", "x509", "-req", "-in", w / "server.csr", "-CA", w / "ca.crt", "-CAkey",
             w / "ca.key", "-CAcreateserial", "-days", "2", "-out", w / "server.crt",
             "-extfile", w / "server.ext"])
        run(["openssl", "genrsa", "-out", w / "sa.key", "2048"])
        self.token = base64.b32encode(os.urandom(20)).decode().lower()
        (w / "tokens.csv").write_text(f"{self.token},admin,admin,system:masters\n")
        self.kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "e2e", "cluster": {
                "server": f"https://127.0.0.1:{API_PORT}", "certificate-authority": str(w / "ca.crt")}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "admin"}}],
            "current-context": "e2e",
        }))

    def pause_image(self):
        """The pod sandbox image: Debian's busybox-static sleeping, FROM scratch (no registry)."""
        ctx = self.work / "pause"
        ctx.mkdir()
        shutil.copy("/bin/busybox", ctx / "busybox")
        (ctx / "Dockerfile").write_text(
            'FROM scratch\nCOPY busybox /busybox\nCMD ["/busybox", "sleep", "2147483647"]\n')
        run(["docker", "build", "-q", "-t", PAUSE_IMAGE, str(ctx)])

    def start(self, name, cmd):
        out = open(self.work / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(
            [str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self, name):
        p = self.procs[name]
        if p.poll() is not None:
            tail = (self.work / f"{name}.log").read_text()[-3000:]
            raise RuntimeError(f"{name} exited {p.returncode}; the end of its log:\n{tail}")
        return True

    def kubectl(self, *args):
        return run(["kubectl", "--kubeconfig", self.kubeconfig, *args])

    def get_json(self, *args):
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def up(self):
        w, b = self.work, self.bin
        self.certificates()
        self.start("etcd", [
            "etcd", "--name", "e2e", "--data-dir", w / "etcd",
            "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
            "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
            "--initial-cluster", f"e2e=http://127.0.0.1:{ETCD_PEER_PORT}"])
        self.start("kube-apiserver", [
            b / "kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{ETCD_PORT}",
            "--bind-address", "0.0.0.0", "--advertise-address", GATEWAY,
            "--secure-port", API_PORT, "--insecure-port", "0",
            "--tls-cert-file", w / "server.crt", "--tls-private-key-file", w / "server.key",
            "--client-ca-file", w / "ca.crt", "--token-auth-file", w / "tokens.csv",
            "--service-account-key-file", w / "sa.key",
            "--service-account-signing-key-file", w / "sa.key",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-cluster-ip-range", "10.96.0.0/16",
            "--authorization-mode", "RBAC,Node", "--allow-privileged=true",
            "--kubelet-preferred-address-types", "InternalIP"])
        wait_for("the API server to be ready",
                 lambda: self.alive("kube-apiserver") and self.kubectl("get", "--raw", "/readyz").strip() == "ok",
                 120)
        self.start("kube-controller-manager", [
            b / "kube-controller-manager", "--kubeconfig", self.kubeconfig, "--leader-elect=false",
            "--service-account-private-key-file", w / "sa.key", "--root-ca-file", w / "ca.crt",
            "--controllers", "*,-nodeipam", "--port", "0"])
        self.start("kube-scheduler", [
            b / "kube-scheduler", "--kubeconfig", self.kubeconfig, "--leader-elect=false", "--port", "0"])
        self.start("kube-proxy", [
            b / "kube-proxy", "--kubeconfig", self.kubeconfig, "--hostname-override", NODE,
            "--proxy-mode", "iptables", "--masquerade-all", "--cluster-cidr", "172.17.0.0/16",
            "--conntrack-max-per-core", "0", "--metrics-bind-address", "127.0.0.1:10249",
            "--healthz-bind-address", "127.0.0.1:10256"])
        self.hosts_dir.mkdir()
        self.start("dnsmasq", [
            "dnsmasq", "--keep-in-foreground", "--user=root", "--no-resolv", "--no-hosts",
            "--listen-address", GATEWAY, "--bind-interfaces", "--port", "53",
            "--hostsdir", self.hosts_dir, "--local=/cluster.local/", "--pid-file=",
            "--log-facility=-"])
        threading.Thread(target=self.serve_service_names, daemon=True).start()
        # The API server's own Service, once the names thread has written it and dnsmasq read it.
        wait_for("DNS to answer for kubernetes.default.svc.cluster.local",
                 lambda: self.alive("dnsmasq") and dns_lookup("kubernetes.default.svc.cluster.local", GATEWAY) == "10.96.0.1",
                 60)
        self.pause_image()
        self.start("kubelet", [
            b / "kubelet", "--kubeconfig", self.kubeconfig, "--container-runtime", "docker",
            "--pod-infra-container-image", PAUSE_IMAGE, "--root-dir", w / "kubelet",
            "--cert-dir", w / "kubelet-pki", "--cgroup-driver", "cgroupfs", "--fail-swap-on=false",
            "--hostname-override", NODE, "--cgroups-per-qos=false", "--enforce-node-allocatable=",
            "--network-plugin=", "--eviction-hard=", "--image-gc-high-threshold=100",
            "--image-gc-low-threshold=99", "--cluster-dns", GATEWAY,
            "--cluster-domain", "cluster.local", "--read-only-port", "0"])
        wait_for("node1 to be Ready", self.node_ready, 120)
        for name in self.procs:
            self.alive(name)

    def node_ready(self):
        for name in self.procs:
            self.alive(name)
        node = self.get_json("node", NODE)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])

    def serve_service_names(self):
        """Keeps the DNS hosts file equal to the cluster's Services (NAME.NS.svc.cluster.local)."""
        written = None
        while not self._stop.is_set():
            try:
                lines = []
                for s in self.get_json("services", "--all-namespaces")["items"]:
                    ip = s["spec"].get("clusterIP")
                    if ip and ip != "None":
                        m = s["metadata"]
                        lines.append(f"{ip} {m['name']}.{m['namespace']}.svc.cluster.local")
                text = "\n".join(sorted(lines)) + "\n"
                if text != written:
                    # Renamed into place whole; dnsmasq passes over dot files.
                    tmp = self.hosts_dir / ".services.tmp"
                    tmp.write_text(text)
                    os.replace(tmp, self.hosts_dir / "services")
                    written = text
            except Exception:  # noqa: BLE001 - the API may be briefly away; try again
                pass
            self._stop.wait(1.0)

    # --- teardown ------------------------------------------------------------------------

    def down(self):
        self._stop.set()
        # The kubelet's containers outlive it: remove them first, then the processes.
        for name in ["kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager",
                     "kube-apiserver", "dnsmasq", "etcd"]:
            p = self.procs.get(name)
            if p and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            if name == "kubelet":
                ids = run(["docker", "ps", "-aq", "--filter", "label=io.kubernetes.pod.namespace"]).split()
                if ids:
                    subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        if "kube-proxy" in self.procs:
            subprocess.run([self.bin / "kube-proxy", "--cleanup"], capture_output=True)
        remove_kube_iptables_chains()
        # Volumes the kubelet mounted (secrets on tmpfs) under its root directory.
        mounts = [l.split()[1] for l in open("/proc/mounts") if str(self.work / "kubelet") in l]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)


def dns_lookup(name, server, timeout_s=1.0):
    """The first IPv4 address a DNS server at server:53 gives for name, or None (one UDP query)."""
    query_id = int.from_bytes(os.urandom(2), "big")
    qname = b"".join(bytes([len(part)]) + part.encode() for part in name.split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", query_id, 0x0100, 1, 0, 0, 0) + qname + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout_s)
        s.sendto(packet, (server, 53))
        answer = s.recv(4096)
    got_id, _flags, _qd, an = struct.unpack(">HHHH", answer[:8])
    if got_id != query_id:
        return None
    at = 12 + len(qname) + 4
    for _ in range(an):
        # A name in an answer is a 2-byte pointer here (dnsmasq compresses it to the question's).
        if answer[at] & 0xC0 == 0xC0:
            at += 2
        else:
            while answer[at]:
                at += answer[at] + 1
            at += 1
        rtype, _cls, _ttl, length = struct.unpack(">HHIH", answer[at:at + 10])
        at += 10
        if rtype == 1 and length == 4:
            return socket.inet_ntoa(answer[at:at + 4])
        at += length
    return None


def remove_kube_iptables_chains():
    """Removes the KUBE-* chains the kubelet and kube-proxy leave (and the jumps into them)."""
    for table in ["filter", "nat", "mangle"]:
        rules = subprocess.run(["iptables", "-t", table, "-S"], capture_output=True, text=True).stdout
        for rule in rules.splitlines():
            parts = shlex.split(rule)
            if parts[:1] == ["-A"] and not parts[1].startswith("KUBE-") and "KUBE-" in rule:
                subprocess.run(["iptables", "-t", table, "-D", *parts[1:]], capture_output=True)
        chains = [l.split()[1] for l in rules.splitlines() if l.startswith("-N KUBE-")]
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
        for chain in chains:
            subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


def save_pod_logs(cluster, into):
    """Every pod's log (and its previous container's) into files, for --keep."""
    into.mkdir(exist_ok=True)
    try:
        for p in cluster.get_json("pods", "--all-namespaces")["items"]:
            name, ns = p["metadata"]["name"], p["metadata"]["namespace"]
            for previous in ["false", "true"]:
                out = subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, "logs", name, "-n", ns,
                                      f"--previous={previous}"], capture_output=True, text=True)
                if out.stdout:
                    suffix = ".previous" if previous == "true" else ""
                    (into / f"{name}{suffix}.log").write_text(out.stdout)
    except Exception as e:  # noqa: BLE001
        log(f"(could not save the pods' logs: {e})")


def reprobench(binary, *args):
    return run([binary, *args])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin-dir", required=True, help="kube-apiserver, kubelet, ... (build-kubernetes.sh)")
    ap.add_argument("--reprobench", required=True, help="the reprobench binary (client side)")
    ap.add_argument("--image", required=True, help="the image `reprobench images self` built")
    ap.add_argument("--tasks", type=int, default=240, help="synthetic tasks in the sweep")
    ap.add_argument("--mean-ms", type=int, default=400, help="mean duration of a synthetic task")
    ap.add_argument("--no-swt-mini", dest="swt_mini", action="store_false",
                    help="skip swt-mini's gold on a docker pool in the cluster")
    ap.add_argument("--json", action="store_true", help="print one JSON object last")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    a = ap.parse_args()
    import helm_python as helm

    # SIGTERM (a CI timeout, kill) unwinds like Ctrl-C, so the cluster is always taken down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = tempfile.mkdtemp(prefix="reprobench-k8s-e2e-", dir="/var/tmp")
    os.chmod(work, 0o755)
    cluster = Cluster(work, a.bin_dir)
    started = time.monotonic()
    try:
        log(f"starting etcd, the control plane, kube-proxy, DNS and the kubelet in {work}")
        cluster.up()
        version = json.loads(cluster.kubectl("version", "-o", "json"))["serverVersion"]["gitVersion"]
        log(f"node1 Ready (server {version}) after {time.monotonic() - started:.0f} s")

        # The coordinator's claim binds to a hostPath volume (no provisioner here).
        pv = pathlib.Path(work) / "pv"
        pv.mkdir(mode=0o777)
        os.chmod(pv, 0o777)
        (pathlib.Path(work) / "pv.json").write_text(json.dumps({
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "e2e-data"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Delete", "hostPath": {"path": str(pv)}}}))
        cluster.kubectl("apply", "-f", str(pathlib.Path(work) / "pv.json"))

        # swt-mini's mirrors for the docker pool, on a host path its pods mount read-only.
        repos = pathlib.Path(work) / "repos"
        if a.swt_mini:
            reprobench(a.reprobench, "datasets", "prepare", "swt-mini", "--repos", str(repos))
        repo, _, tag = a.image.rpartition(":")
        values = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "coordinator": {"persistence": {"size": "1Gi"}},
            "pools": {
                # The host's engine through its socket; input files under a host path.
                "docker": {"enabled": a.swt_mini, "replicas": 1, "slots": {"docker": 2},
                           "repos": {"hostPath": str(repos)},
                           "docker": {"scratchPath": str(pathlib.Path(work) / "scratch")},
                           "drainTimeoutS": 30},
                "sim": {"enabled": True, "replicas": 2, "slots": {"synthetic": 2},
                        "drainTimeoutS": 30, "podDisruptionBudget": {"enabled": False}},
            },
        }
        log("installing the chart with helm-python-sdk (Helm's Go SDK), waiting for its pods")
        config = helm.Config(kubeconfig_path=str(cluster.kubeconfig), namespace=NAMESPACE)
        try:
            config.install(str(CHART), RELEASE, values, timeout=300, wait="watcher")
        except Exception:
            log(cluster.kubectl("get", "pods,pvc,pv,svc", "-o", "wide"))
            log(cluster.kubectl("describe", "pods"))
            raise
        pods = cluster.get_json("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        coordinator = next(p for p in pods if p["metadata"]["labels"].get("app.kubernetes.io/component") == "coordinator")
        nodes = [p["metadata"]["name"] for p in pods
                 if p["metadata"]["labels"].get("app.kubernetes.io/component") == "node"
                 and p["metadata"]["labels"].get("reprobench.dev/pool") == "sim"]
        # TLS is on by default: the chart's CA, and the certificate's name for the pod's address.
        url = f"https://{coordinator['status']['podIP']}:7077"
        tls_secret = next(s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                          if s["metadata"]["name"] == f"{RELEASE}-reprobench-tls")
        ca_file = pathlib.Path(work) / "coordinator-ca.crt"  # work/ca.crt is the cluster's own CA
        ca_file.write_bytes(base64.b64decode(tls_secret["data"]["ca.crt"]))
        service = next(s["metadata"]["name"] for s in cluster.get_json("services", "-n", NAMESPACE)["items"]
                       if s["metadata"]["name"].endswith("-coordinator"))
        tls = ["--tls-ca", str(ca_file), "--tls-server-name", service]
        secret = next(s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                      if s["metadata"]["name"].endswith("-token") and s["metadata"]["name"].startswith(RELEASE))
        token_file = pathlib.Path(work) / "token"
        token_file.write_bytes(base64.b64decode(secret["data"]["token"]))
        log(f"release up: coordinator {url}, node pods {nodes}")

        sweep = pathlib.Path(work) / "sweep.toml"
        sweep.write_text(f'name = "k8s-e2e"\ndatasets = ["synthetic:{a.tasks}:{a.mean_ms}"]\n'
                         '[[agents]]\nname = "synthetic"\n')
        target = ["--coordinator", url, "--token-file", str(token_file), *tls]
        # The sim pool's node credential: its nodes present it; as a client it is refused.
        pool_secret = next(s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                           if s["metadata"]["name"].endswith("-node-sim-credential"))
        pool_token = pathlib.Path(work) / "sim-credential"
        pool_token.write_bytes(base64.b64decode(pool_secret["data"]["token"]))
        as_client = subprocess.run([a.reprobench, "status", "--coordinator", url, "--token-file", str(pool_token), *tls],
                                   capture_output=True, text=True)
        run_id = json.loads(reprobench(a.reprobench, "run", str(sweep), *target, "--detach", "--json"))["run_id"]
        log(f"submitted run {run_id}: {a.tasks} synthetic tasks")

        def status():
            return json.loads(reprobench(a.reprobench, "status", run_id, *target, "--json"))

        def done(s):
            return s["succeeded"] + s["failed"] + s["errored"]

        wait_for("a quarter of the tasks to finish", lambda: done(status()) >= a.tasks // 4, 600)
        victim = nodes[0]
        log(f"killing node pod {victim} (force delete: no drain) at {done(status())}/{a.tasks} done")
        cluster.kubectl("delete", "pod", victim, "-n", NAMESPACE, "--grace-period=0", "--force")
        final = wait_for("the run to finish", lambda: (lambda s: s if s["state"] == "finished" else None)(status()), 900, 1.0)
        rows = [json.loads(l) for l in reprobench(a.reprobench, "results", run_id, *target).splitlines() if l.strip()]
        keys = {(r["instance_id"], r["repeat"]) for r in rows}
        pods_after = cluster.get_json("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/component=node")["items"]
        # The coordinator's store is on the hostPath volume: its attempts say why each ended.
        store = json.loads(reprobench(a.reprobench, "status", run_id, "--attempts", "--json", "--data", str(pv)))
        gone = [t for t in store["attempts"] if t["status"] == "node_gone"]
        late_rejected = sum(1 for t in store["attempts"] if t.get("late_result_rejected_at_ms"))

        swt = None
        if a.swt_mini:
            log("swt-mini's gold on the docker pool (the host's engine through the pod's socket)")
            swt = json.loads(reprobench(a.reprobench, "eval", "--dataset", "swt-mini", "--predictions", "gold",
                                        "--executor", "docker", *target, "--out", str(pathlib.Path(work) / "reports"),
                                        "--json").strip().splitlines()[-1])
            log(f"swt-mini gold: {json.dumps(swt)}")

        log("upgrading the release (same values): the join token must stay")
        config.upgrade(str(CHART), RELEASE, values, timeout=300, wait="watcher")
        secret_after = next(s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                            if s["metadata"]["name"] == secret["metadata"]["name"])
        result = {
            "tasks": final["tasks"],
            "result_rows": len(rows),
            "duplicated": len(rows) - len(keys),
            "succeeded": final["succeeded"],
            "failed": final["failed"],
            "errored": final["errored"],
            "pods_deleted": 1,
            "nodes_delivering": len({r["node_id"] for r in rows}),
            "retried_attempts": final["retried_attempts"],
            # Attempts of the killed pod released when the coordinator's watch saw it deleted,
            # not after their lease timed out; results that came late were refused (fencing).
            "released_at_pod_deletion": len(gone),
            "late_results_rejected": late_rejected,
            "token_kept_on_upgrade": secret_after["data"]["token"] == secret["data"]["token"],
            "tls_kept_on_upgrade": next(
                s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                if s["metadata"]["name"] == tls_secret["metadata"]["name"])["data"] == tls_secret["data"],
            "pool_credential_kept_on_upgrade": next(
                s for s in cluster.get_json("secrets", "-n", NAMESPACE)["items"]
                if s["metadata"]["name"] == pool_secret["metadata"]["name"])["data"]["token"]
                == pool_secret["data"]["token"],
            "node_credential_refused_as_client": as_client.returncode != 0,
            "node_pods_after": len(pods_after),
            "swt_mini_gold": None if swt is None else {
                k: swt.get(k) for k in ["total", "completed", "resolved", "errors", "mean_coverage_delta", "wall_s"]},
            "kubelet": True,
            "server_version": version,
            "wall_s": round(time.monotonic() - started, 1),
        }
        problems = []
        if not result["result_rows"] == result["tasks"] == a.tasks:
            problems.append(f"{result['result_rows']} result rows for {a.tasks} tasks")
        idle = [n for n in nodes if n not in {r["node_id"] for r in rows}]
        if idle:
            problems.append(f"node pods that delivered no result: {idle}")
        if result["duplicated"]:
            problems.append(f"{result['duplicated']} duplicated result rows")
        if not gone or any(victim not in t["reason"] for t in gone):
            problems.append("the killed pod's attempts were not released by the pod watch: "
                            + json.dumps(gone))
        if swt is not None and not (swt["resolved"] == swt["total"] > 0):
            problems.append(f"swt-mini gold on the docker pool: {json.dumps(swt)}")
        if not result["token_kept_on_upgrade"]:
            problems.append("helm upgrade replaced the join token")
        if not result["tls_kept_on_upgrade"]:
            problems.append("helm upgrade replaced the coordinator's certificate or CA")
        if not result["pool_credential_kept_on_upgrade"]:
            problems.append("helm upgrade replaced the sim pool's node credential")
        if not result["node_credential_refused_as_client"]:
            problems.append("the sim pool's node credential was accepted as a client's: "
                            + as_client.stdout + as_client.stderr)
        ok = not problems
        for p in problems:
            log(f"FAILED: {p}")
        log(json.dumps(result))
        if a.json:
            print(json.dumps(result))
        return 0 if ok else 1
    except Exception:
        # What the pods said, where the user looks, before the cluster goes.
        try:
            log(cluster.kubectl("get", "pods,pvc,svc", "--all-namespaces", "-o", "wide"))
            for p in cluster.get_json("pods", "-n", NAMESPACE)["items"]:
                name = p["metadata"]["name"]
                out = subprocess.run(["kubectl", "--kubeconfig", cluster.kubeconfig, "logs", "--tail", "40",
                                      name, "-n", NAMESPACE], capture_output=True, text=True)
                log(f"--- {name}:\n{out.stdout}{out.stderr}")
        except Exception as e:  # noqa: BLE001
            log(f"(could not read the pods: {e})")
        raise
    finally:
        if a.keep:
            save_pod_logs(cluster, pathlib.Path(work) / "pod-logs")
        cluster.down()
        if a.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
