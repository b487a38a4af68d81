#!/usr/bin/env bash
# Creates the virtual environments in which the client distribution and the framework adapters
# are tested, apart from the server's .venv (run from anywhere; CI runs it from .ci/run):
#   .venv-client-pb5 / -pb6 / -pb7  voxgate-client on protobuf 5.29, 6.x and 7.x (pb5 also has
#                                   grpcio-tools 1.71.2, which generates the client's stubs)
#   .venv-pipecat                    pipecat-ai (needs protobuf < 7) + pipecat-voxgate
#   .venv-livekit                    livekit-agents + livekit-plugins-voxgate
# They hold no server: their tests talk to a real server started from .venv, as a bot talks to a
# gateway in its own environment. Installs are editable, so the tests see the working tree. Re-running is cheap: an existing venv is only updated.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
PY="${PYTHON:-python3}"

log_dir="$(mktemp -d)"
trap 'rm -rf "$log_dir"' EXIT

mkvenv() {  # mkvenv DIR PIP-ARGS...: create or update one venv, its pip output in a log
  local dir="$1"; shift
  local t0=$SECONDS
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  if ! "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@" \
      >"$log_dir/${dir#.}.log" 2>&1; then
    echo "   $dir: pip install failed:" >&2
    tail -30 "$log_dir/${dir#.}.log" >&2
    return 1
  fi
  echo "   $dir ready in $((SECONDS - t0)) s"
}

# The five environments share no files, so they install side by side (pip is mostly waiting
# on downloads and unpacking): 260 s for all five from scratch on 2 busy cores, warm pip cache.
client="./clients/voxgate-client[test]"
t0=$SECONDS
pids=()
mkvenv .venv-client-pb5 -e "$client" 'protobuf==5.29.*' 'grpcio-tools==1.71.2' & pids+=($!)
mkvenv .venv-client-pb6 -e "$client" 'protobuf>=6.31,<7' & pids+=($!)
mkvenv .venv-client-pb7 -e "$client" 'protobuf>=7,<8' & pids+=($!)
mkvenv .venv-pipecat -e "$client" -e './clients/pipecat-voxgate[test]' 'pipecat-ai==1.14.0' &
pids+=($!)
mkvenv .venv-livekit -e "$client" -e './clients/livekit-plugins-voxgate[test]' \
  'livekit-agents==1.8.9' & pids+=($!)
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
[ "$failed" = 0 ] || exit 1
echo "   all client environments ready in $((SECONDS - t0)) s"
