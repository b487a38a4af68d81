#!/usr/bin/env bash
# Regenerates the committed Python stubs from protos/voxgate/v1/*.proto with the client
# distribution's gencode (protobuf 5.29, grpcio-tools 1.71.2): newer runtimes load older
# gencode, never the reverse, so the stubs load on any protobuf the server asks for (6.31
# through 7.x) and the server installs beside pipecat-ai (protobuf < 7; the `turn` extra).
# Usage: protos/generate.sh [OUTDIR] [PYTHON]
#   OUTDIR: default protos, i.e. next to the .proto files
#   PYTHON: an interpreter with grpcio-tools==1.71.2 (default: .venv-client-pb5/bin/python,
#           which clients/setup-venvs.sh creates)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
py="${2:-$here/../.venv-client-pb5/bin/python}"
if [ ! -x "$py" ]; then
  echo "no $py: run clients/setup-venvs.sh first (it creates the protobuf 5.29 venv)" >&2
  exit 2
fi
"$py" -m grpc_tools.protoc -I"$here" --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" "$here"/voxgate/v1/voxgate.proto
# The client distribution's own stubs (the same gencode, without the grpc module) follow the
# same .proto; regenerate them too when the committed stubs are the target.
if [ "$#" -eq 0 ]; then
  "$here/../clients/voxgate-client/generate_stubs.sh" "$py"
fi
