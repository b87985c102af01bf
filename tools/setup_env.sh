# shellcheck shell=bash
# The steps tools/test.sh and tools/bench.sh share; sourced by them (with `set -euo pipefail`), not run.
#
# Sourcing it changes to the repository root and defines:
#   parse_build_flag "$@"     sets BUILD (1, or 0 if --no-build is among the arguments) and ARGS
#                             (the other arguments, in order)
#   install_missing_packages  pip-installs only what is missing, so a machine that has everything
#                             (and perhaps no network) installs nothing
#   extension_is_built        whether a compiled flash_attention._C is found (as the tests look for it)
#   build_extension           builds flash_attention._C in place (editable install), printing one
#                             line per compiled unit and, on failure, the end of the build's output
# PYTHON selects the interpreter (default: python3).

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.11.0
# The integration's tests (tests/test_transformers.py) run against the version the GPU machine has.
TRANSFORMERS_VERSION=5.17.0

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
    # module:package, for packages whose import name differs (pytest-xdist runs `pytest -n N`)
    local entry
    for entry in pybind11 pytest xdist:pytest-xdist ninja setuptools wheel "transformers:transformers==$TRANSFORMERS_VERSION"; do
        if ! "$PYTHON" -c "import ${entry%%:*}" 2>/dev/null; then
            pip_install "${entry#*:}"
        fi
    done
}

extension_is_built() {
    # Found without importing the package, whose import needs the extension; py/ first, as pytest
    # (pyproject.toml's pythonpath) puts it.
    PYTHONPATH="py${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "
import importlib.machinery, importlib.util, pathlib, sys
spec = importlib.util.find_spec('flash_attention')
locations = (spec.submodule_search_locations or []) if spec else []
sys.exit(not any(pathlib.Path(location, '_C' + suffix).exists()
                 for location in locations for suffix in importlib.machinery.EXTENSION_SUFFIXES))"
}

build_extension() {
    # setup.py reads FLASH_BUILD_KERNELS (which kernels), TORCH_CUDA_ARCH_LIST (which GPUs) and
    # FLASH_BUILD_PTX_ONLY (PTX without machine code);
    # torch's build reads MAX_JOBS (parallel compiler processes).
    export MAX_JOBS=${MAX_JOBS:-$(nproc)}
    echo "building flash_attention._C: FLASH_BUILD_KERNELS=${FLASH_BUILD_KERNELS:-default}" \
        "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-(setup.py default)} FLASH_BUILD_PTX_ONLY=${FLASH_BUILD_PTX_ONLY:-0}" \
        "MAX_JOBS=$MAX_JOBS" >&2
    echo "every configuration is a compilation unit of its own (README.md says how long the default set" \
        "takes); one line per compiled unit follows ([done/total] file)" >&2
    local log start=$SECONDS
    log=$(mktemp "${TMPDIR:-/tmp}/flash_attention_build.XXXXXX")
    # No build isolation: compile against the torch installed here. -v lets ninja's [done/total]
    # lines through; show_build_progress keeps those, the whole output goes to $log.
    if ! PYTHONUNBUFFERED=1 "$PYTHON" -m pip install -v --disable-pip-version-check --no-build-isolation \
        --no-deps -e . 2>&1 | tee "$log" | show_build_progress; then
        echo "the build failed; the end of its output (all of it: $log):" >&2
        tail -n 80 "$log" >&2
        return 1
    fi
    echo "built in $((SECONDS - start)) s (the build's output: $log)" >&2
}

# Reads the build's output and prints one line per ninja step: "[done/total] file compiled" (pip -v
# indents the build's lines).
show_build_progress() {
    awk '/^[[:space:]]*\[[0-9]+\/[0-9]+\] / {
        target = ""
        for (i = 2; i <= NF; i++) if ($i ~ /\.(cu|cpp|so)$/) { target = $i; break }
        n = split(target, parts, "/")
        print $1, (n ? parts[n] : "")
        fflush()
    }' >&2
}
