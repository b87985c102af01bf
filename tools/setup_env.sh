# shellcheck shell=bash
# The steps tools/test.sh and tools/bench.sh share; sourced by them (with `set -euo pipefail`), not run.
#
# Sourcing it changes to the repository root and defines:
#   parse_build_flag "$@"     sets BUILD (1, or 0 if --no-build is among the arguments) and ARGS
#                             (the other arguments, in order)
#   install_missing_packages  pip-installs only what is missing, so a machine that has everything
#                             (and perhaps no network) installs nothing
#   build_extension           builds flash_attention._C in place (editable install)
# PYTHON selects the interpreter (default: python3).

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.11.0

# BUILD and ARGS are read by the scripts that source this file.
# shellcheck disable=SC2034
parse_build_flag() {
    BUILD=1
    ARGS=()
    local arg
    for arg in "$@"; do
        if [[ $arg == --no-build ]]; then
            BUILD=0
        else
            ARGS+=("$arg")
        fi
    done
}

pip_install() {
    echo "installing $*" >&2
    "$PYTHON" -m pip install --disable-pip-version-check "$@"
}

install_missing_packages() {
    # The extension is compiled against torch's C++ API, which changes between minor versions.
    if ! "$PYTHON" -c "import sys, torch; sys.exit(not torch.__version__.startswith('${TORCH_VERSION%.*}.'))" 2>/dev/null; then
        pip_install "torch==$TORCH_VERSION"
    fi
    local module
    for module in pybind11 pytest ninja setuptools wheel; do
        if ! "$PYTHON" -c "import $module" 2>/dev/null; then
            pip_install "$module"
        fi
    done
}

build_extension() {
    # setup.py reads FLASH_BUILD_KERNELS (which kernels) and TORCH_CUDA_ARCH_LIST (which GPUs);
    # torch's build reads MAX_JOBS (parallel compiler processes).
    export MAX_JOBS=${MAX_JOBS:-$(nproc)}
    echo "building flash_attention._C: FLASH_BUILD_KERNELS=${FLASH_BUILD_KERNELS:-default}" \
        "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-(setup.py default)} MAX_JOBS=$MAX_JOBS" >&2
    # No build isolation: compile against the torch installed here. pip prints the compiler's
    # output if the build fails.
    "$PYTHON" -m pip install --disable-pip-version-check --no-build-isolation --no-deps -e .
}
