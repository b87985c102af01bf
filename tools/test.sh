#!/usr/bin/env bash
# Installs what is missing, builds the extension and runs the tests:
#   bash tools/test.sh [--no-build] [pytest arguments...]
# GPU tests skip, with the reason, where no GPU is visible. The exit status is pytest's.
set -euo pipefail
# shellcheck source=tools/setup_env.sh
source "$(dirname "${BASH_SOURCE[0]}")/setup_env.sh"

parse_build_flag "$@"
install_missing_packages
if ((BUILD)); then
    build_extension
fi
# -ra lists every skipped test with its reason.
exec "$PYTHON" -m pytest -ra "${ARGS[@]}"
