#!/usr/bin/env bash
# Installs what is missing, builds the extension and compares its kernels with PyTorch's SDPA:
#   bash tools/bench.sh [--no-build] [pt_bench.py arguments...]   (see: bash tools/bench.sh --help)
# Needs a CUDA GPU: without one it says so and fails before building. --help needs none.
set -euo pipefail
# shellcheck source=tools/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

parse_build_flag "$@"
for arg in "${ARGS[@]}"; do
    if [[ $arg == -h || $arg == --help ]]; then
        echo "usage: bash tools/bench.sh [--no-build] [pt_bench.py arguments...]"
        echo "  installs what is missing, builds the extension (not with --no-build), then runs"
        echo "  tools/benchmark/pt_bench.py with the other arguments; needs a CUDA GPU. pt_bench.py's arguments:"
        echo
        exec "$PYTHON" tools/benchmark/pt_bench.py --help
    fi
done
install_missing_packages
"$PYTHON" tools/benchmark/pt_bench.py --check-gpu
if ((BUILD)); then
    build_extension
fi
exec "$PYTHON" tools/benchmark/pt_bench.py "${ARGS[@]}"
