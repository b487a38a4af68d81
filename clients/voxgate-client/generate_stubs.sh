#!/usr/bin/env bash
# Regenerates the client's own protobuf stubs (clients/voxgate_client/_proto/) from
# protos/voxgate/v1/voxgate.proto with the OLDEST gencode the client supports (protobuf 5.29,
# grpcio-tools 1.71.2): newer runtimes load older gencode (6.x and 7.x were measured), never
# the reverse, so one set of stubs serves protobuf 5.29 through 7.x.
# Usage: clients/voxgate-client/generate_stubs.sh [PYTHON] [OUTDIR]
#   PYTHON: an interpreter with grpcio-tools==1.71.2 (default: .venv-client-pb5/bin/python,
#           which clients/setup-venvs.sh creates); OUTDIR defaults to the committed location.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="${1:-$root/.venv-client-pb5/bin/python}"
out="${2:-$root/clients/voxgate_client/_proto}"
if [ ! -x "$py" ]; then
  echo "no $py: run clients/setup-venvs.sh first (it creates the protobuf 5.29 venv)" >&2
  exit 2
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# -I protos keeps the file name voxgate/v1/voxgate.proto in the descriptor pool, the same as
# the server's stubs, so both can be loaded in one process and share message classes.
"$py" -m grpc_tools.protoc -I"$root/protos" --python_out="$tmp" --pyi_out="$tmp" \
  "$root/protos/voxgate/v1/voxgate.proto"
mkdir -p "$out"
cp "$tmp/voxgate/v1/voxgate_pb2.py" "$tmp/voxgate/v1/voxgate_pb2.pyi" "$out/"
