#!/usr/bin/env bash
# Run `python -m benchmarks.gpu_check` from the repository root with the project's venv.
#
#   benchmarks/gpu_check.sh                                  # auto device, random large-v3
#   benchmarks/gpu_check.sh --model /models/whisper-large-v3-ct2
#   benchmarks/gpu_check.sh --tiny --device cpu              # CPU smoke run (< 60 s)
#
# Every argument is passed through (see `--help`). The report goes to ./gpu_check.json unless
# --out is given; the table goes to stdout, progress to stderr. The script keeps itself within
# --budget-s (450 s); the hard limit below only stops a hung run (GPU_CHECK_TIMEOUT_S).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "${python}" ]]; then
    if [[ -x "${root}/.venv/bin/python" ]]; then
        python="${root}/.venv/bin/python"
    else
        python="$(command -v python3)"
    fi
fi

cd "${root}"
exec timeout --signal=INT --kill-after=30 "${GPU_CHECK_TIMEOUT_S:-570}" \
    "${python}" -m benchmarks.gpu_check "$@"
