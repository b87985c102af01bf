#!/usr/bin/env bash
# Installs what is missing, builds the extension and compares its kernels with PyTorch's SDPA:
#   bash tools/bench.sh [--no-build] [pt_bench.py arguments...]   (see: python tools/benchmark/pt_bench.py --help)
# Needs a CUDA GPU: without one it says so and fails before building.
set -euo pipefail
# shellcheck source=tools/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

parse_build_flag "$@"
install_missing_packages
"$PYTHON" tools/benchmark/pt_bench.py --check-gpu
if ((BUILD)); then
    build_extension
fi
exec "$PYTHON" tools/benchmark/pt_bench.py "${ARGS[@]}"
