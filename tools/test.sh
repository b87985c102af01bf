#!/usr/bin/env bash
# Installs what is missing, builds the extension and runs the tests:
#   bash tools/test.sh [--no-build] [pytest arguments...]
# GPU tests skip, with the reason, where no GPU is visible. The exit status is pytest's, or 1 where
# --no-build finds no built extension (the tests would run only those that need none).
set -euo pipefail
# shellcheck source=tools/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

parse_build_flag "$@"
install_missing_packages
if ((BUILD)); then
    build_extension
elif ! extension_is_built; then
    echo "tools/test.sh --no-build: flash_attention._C is not built, so every test that needs it would be" \
        "skipped. Build it first (bash tools/test.sh, without --no-build), or run only the tests that need" \
        "no build with $PYTHON -m pytest." >&2
    exit 1
fi
# -ra lists every skipped test with its reason.
exec "$PYTHON" -m pytest -ra "${ARGS[@]}"
