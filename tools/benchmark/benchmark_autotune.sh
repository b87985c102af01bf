#!/usr/bin/env bash
# Autotuning sweep: times every compiled configuration of the tuning set at the benchmark shapes,
# without and with the causal mask, and prints the ranking (see: python tools/benchmark/autotune.py --help).
#   bash tools/benchmark/benchmark_autotune.sh [SEQ_LEN...] [autotune.py options: --causal off|on|both, ...]
# SEQ_LENs default to 512 1024 2048 4096 8192 16384; the options start at the first argument that
# is not a number. KERNELS selects the configurations (default: tune, intersected with the build:
# build them with FLASH_BUILD_KERNELS=tune). Timings go to profiles/autotune.csv unless --csv says
# otherwise. Needs a CUDA GPU.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PYTHON=${PYTHON:-python3}
export KERNELS=${KERNELS:-tune}

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,8s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    echo
    exec "$PYTHON" tools/benchmark/autotune.py --help
fi

SEQ_LENS=()
while (($#)) && [[ $1 =~ ^[0-9]+$ ]]; do
    SEQ_LENS+=("$1")
    shift
done
if ((${#SEQ_LENS[@]} == 0)); then
    SEQ_LENS=(512 1024 2048 4096 8192 16384)
fi
exec "$PYTHON" tools/benchmark/autotune.py --seq-lens "${SEQ_LENS[@]}" "$@"
