"""Importing flash_attention from a checkout whose extension is not built says so, and how to build it.

Each test imports a copy of the package's __init__.py from a temporary directory in a fresh
interpreter (`-S`: no site-packages, so no installed flash_attention is found instead), so it needs
no build and no GPU.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

PACKAGE_INIT = pathlib.Path(__file__).resolve().parents[1] / "py" / "flash_attention" / "__init__.py"


def import_copy(tmp_path: pathlib.Path, with_compiled_module: bool) -> subprocess.CompletedProcess:
    package = tmp_path / "flash_attention"
    package.mkdir()
    shutil.copy(PACKAGE_INIT, package / "__init__.py")
    if with_compiled_module:
        (package / "_C.py").write_text("# stands in for the compiled extension\n")
    return subprocess.run(
        [sys.executable, "-S", "-c", "import flash_attention"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_import_without_compiled_module_says_not_built_and_how_to_build(tmp_path):
    result = import_copy(tmp_path, with_compiled_module=False)
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ImportError: flash_attention._C, the compiled extension, is not built")
    assert "bash tools/test.sh" in last_line
    assert "pip install --no-build-isolation -e ." in last_line
    assert "circular import" not in result.stderr


def test_import_with_compiled_module_goes_past_the_check(tmp_path):
    # The copy's next import (flash_helpers, not on this path) fails; the check itself passes.
    result = import_copy(tmp_path, with_compiled_module=True)
    assert "is not built" not in result.stderr
    assert "flash_helpers" in result.stderr
