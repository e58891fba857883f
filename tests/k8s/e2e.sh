#!/usr/bin/env bash
# A real single-node Kubernetes cluster on loopback, from Debian's own packages, with the chart
# installed into it and a sweep run through the coordinator pod while a node pod is killed.
#
#   tests/k8s/e2e.sh [--json] [--keep] [--tasks N]
#
# Needs root, Docker and Debian's archive once (the kubernetes source package, Go, etcd). Cold it
# builds kube-apiserver, -controller-manager, -scheduler, -proxy and the kubelet from bookworm's
# `kubernetes` source (1.20.2) with bookworm's Go (about half an hour on 2 cores), cached in
# /var/tmp/reprobench-k8s keyed by the source version; warm it takes minutes. The Python side
# (helm-python-sdk: Helm v4's Go SDK) lives in a venv under /var/tmp keyed by its pins.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" != 0 ]; then echo "tests/k8s/e2e.sh runs a kubelet and needs root" >&2; exit 2; fi
docker info >/dev/null 2>&1 || { echo "tests/k8s/e2e.sh needs a running Docker engine (the kubelet's dockershim drives it)" >&2; exit 2; }

pkgs=()
command -v etcd >/dev/null || pkgs+=(etcd-server)
command -v dnsmasq >/dev/null || pkgs+=(dnsmasq-base)
command -v conntrack >/dev/null || pkgs+=(conntrack)
[ -x /bin/busybox ] || pkgs+=(busybox-static)
command -v debootstrap >/dev/null || pkgs+=(debootstrap)
if [ ${#pkgs[@]} -gt 0 ]; then
  echo "installing ${pkgs[*]} from Debian" >&2
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkgs[@]}" >&2
fi
command -v kubectl >/dev/null || { echo "tests/k8s/e2e.sh needs kubectl on PATH" >&2; exit 2; }

bindir="$(tests/k8s/build-kubernetes.sh)"

pins="helm-python-sdk==0.2.2"
venv="/var/tmp/reprobench-test-venvs/k8s-e2e-$(echo "$pins" | sha256sum | cut -c1-12)"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import helm_python" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check $pins >&2
fi

echo "== building reprobench and its image (images bootstrap, images self)" >&2
cargo build --quiet
target="${CARGO_TARGET_DIR:-target}"
reprobench="$target/debug/reprobench"
"$reprobench" images bootstrap >&2
image="$("$reprobench" images self)"

exec "$venv/bin/python" tests/k8s/e2e.py --bin-dir "$bindir" --reprobench "$reprobench" --image "$image" "$@"
