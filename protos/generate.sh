#!/usr/bin/env bash
# Regenerates the committed Python stubs from protos/voxgate/v1/*.proto.
# Usage: protos/generate.sh [OUTDIR]   (default: protos, i.e. next to the .proto files)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
python -m grpc_tools.protoc -I"$here" --python_out="$out" --pyi_out="$out" \
  --grpc_python_out="$out" "$here"/voxgate/v1/voxgate.proto
# The client distribution's own stubs (protobuf 5.29 gencode, see that script) follow the same
# .proto; regenerate them too when the committed stubs are the target.
if [ "$#" -eq 0 ]; then
  "$here/../clients/voxgate-client/generate_stubs.sh"
fi
