#!/usr/bin/env bash
# Builds a Kubernetes control plane and kubelet from Debian bookworm's `kubernetes` source package
# (upstream 1.20.2 with vendor/), offline, with bookworm's Go. Prints the directory holding the
# binaries. Cached outside the checkout, keyed by the source version: a second run builds nothing.
#
# Two changes to the source, both needed on these machines (see ../shared/k8s-local-cluster.md):
# the vendored reflect2 1.0.1 crashes under Go >= 1.18 and is replaced by Debian's 1.0.2; and the
# kubelet's negative oom_score_adj for sandboxes and Guaranteed pods is set to 0, which this
# machine's kernel lets an unprivileged container runtime set.
set -euo pipefail

version="1.20.5+really1.20.2-1.1+deb12u1"
cache="${REPROBENCH_K8S_CACHE:-/var/tmp/reprobench-k8s}/$version"
bin="$cache/bin"
wanted=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

have_all() { for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

need_pkgs=()
command -v go >/dev/null || need_pkgs+=(golang-go)
command -v dpkg-source >/dev/null || need_pkgs+=(dpkg-dev)
command -v rsync >/dev/null || need_pkgs+=(rsync)  # the build copies its generators with it
[ -d /usr/share/gocode/src/github.com/modern-go/reflect2 ] || need_pkgs+=(golang-github-modern-go-reflect2-dev)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing ${need_pkgs[*]} from Debian" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >&2
fi

mkdir -p "$cache"
src="$cache/src"
if [ ! -f "$src/.reprobench-patched" ]; then
  rm -rf "$src" "$cache/apt"
  mkdir -p "$cache/apt/lists"
  printf 'deb-src http://deb.debian.org/debian bookworm main\ndeb-src http://deb.debian.org/debian-security bookworm-security main\n' \
    > "$cache/apt/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$cache/apt/sources.list" -o "Dir::Etc::sourceparts=-"
            -o "Dir::State::Lists=$cache/apt/lists")
  apt-get "${apt_opts[@]}" update -qq >&2 || {
    echo "cannot reach Debian's archive for the kubernetes source package; this script needs it once (then it is cached in $cache)" >&2
    exit 1
  }
  (cd "$cache/apt" && apt-get "${apt_opts[@]}" source --download-only "kubernetes=$version" >&2)
  dpkg-source --no-check -x "$cache/apt/kubernetes_$version.dsc" "$src" >&2
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/reflect2"
  sed -i 's/defaultSandboxOOMAdj[[:space:]]*int[[:space:]]*=[[:space:]]*-998/defaultSandboxOOMAdj int = 0/' \
    "$src/pkg/kubelet/dockershim/docker_sandbox.go"
  sed -i 's/guaranteedOOMScoreAdj[[:space:]]*int[[:space:]]*=[[:space:]]*-997/guaranteedOOMScoreAdj int = 0/' \
    "$src/pkg/kubelet/qos/policy.go"
  grep -q 'defaultSandboxOOMAdj int = 0' "$src/pkg/kubelet/dockershim/docker_sandbox.go"
  grep -q 'guaranteedOOMScoreAdj int = 0' "$src/pkg/kubelet/qos/policy.go"
  touch "$src/.reprobench-patched"
fi

export GOPROXY=off GOFLAGS=-mod=vendor GOCACHE="$cache/go-cache" GOPATH="$cache/gopath"
mkdir -p "$bin"
missing=()
for b in "${wanted[@]}"; do [ -x "$bin/$b" ] || missing+=("$b"); done
# One make for every missing binary: each make call repeats Kubernetes' own preamble (its
# generators and their checks), so one call per binary paid it five times.
echo "building ${missing[*]} (about 20 minutes on 2 cores; cached afterwards)" >&2
start=$(date +%s)
(cd "$src" && make WHAT="${missing[*]/#/cmd/}" >&2)
echo "built in $(( $(date +%s) - start )) s" >&2
for b in "${missing[@]}"; do
  cp "$src/_output/local/bin/linux/amd64/$b" "$bin/$b.tmp" && mv "$bin/$b.tmp" "$bin/$b"
done
echo "$bin"
