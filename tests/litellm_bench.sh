#!/usr/bin/env bash
# The gateway against LiteLLM's proxy, in one run on the same scripted upstream: plain and
# streamed sequential calls (the three arms taking turns) and calls/s at 64 concurrent callers,
# with the release build of the gateway benchmark (`gateway_bench`, without the analysis crate).
# A benchmark, not a CI test.
#
#   tests/litellm_bench.sh [CALLS] [CONCURRENCY] [--litellm-workers N]   prints the report's JSON
#   tests/litellm_bench.sh --install                                     only install LiteLLM
#
# LiteLLM (PyPI's litellm[proxy], pinned below) is installed once in a virtual environment under
# $REPROBENCH_LITELLM_CACHE (default /var/tmp/reprobench-litellm)/<version>. It runs with its
# defaults (1 worker, no database, no Redis, no callbacks) and a master key; the benchmark sets
# LITELLM_LOCAL_MODEL_COST_MAP=True and the other LITELLM_LOCAL_* switches so that it fetches
# nothing from the network when it starts (see crates/gateway/src/bench/litellm.rs).
# Build directory: $CARGO_TARGET_DIR, default /var/tmp/release-target.
set -euo pipefail
cd "$(dirname "$0")/.."

# 1.106.12: the newest release whose `proxy` extra installed from PyPI on 2026-12-05 (1.110.2's
# needs litellm-proxy==1.110.2, 1.109.3's and 1.108.14's litellm-proxy-extras 0.4.113 and
# 0.4.110.post1: pip found none of them).
LITELLM=1.106.12

say() { echo "litellm_bench: $*" >&2; }

install_only=0
args=()
for arg in "$@"; do
  case "$arg" in
    --install) install_only=1 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$arg") ;;
  esac
done

cache="${REPROBENCH_LITELLM_CACHE:-/var/tmp/reprobench-litellm}/$LITELLM"
py="${PYTHON:-python3}"
venv="$cache/venv"
litellm="$venv/bin/litellm"
if [ ! -x "$litellm" ] || [ ! -f "$cache/installed" ]; then
  say "installing litellm[proxy]==$LITELLM in $venv (from PyPI, once)"
  mkdir -p "$cache"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  # This network re-signs TLS: trust the host's CA bundle when there is one.
  cert=()
  if [ -z "${PIP_CERT:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cert=(--cert /etc/ssl/certs/ca-certificates.crt)
  fi
  if ! "$venv/bin/pip" install --quiet "${cert[@]}" "litellm[proxy]==$LITELLM" >&2; then
    say "pip could not install litellm[proxy]==$LITELLM: it needs PyPI once (see pip's output above)"
    exit 1
  fi
  touch "$cache/installed"
fi
say "LiteLLM $("$venv/bin/pip" show litellm 2>/dev/null | sed -n 's/^Version: //p') at $litellm"
[ "$install_only" = 1 ] && exit 0

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/release-target}"
nice -n 19 cargo build --release --quiet -p reprobench-gateway --example gateway_bench >&2
"$CARGO_TARGET_DIR/release/examples/gateway_bench" "${args[@]}" --litellm "$litellm"
