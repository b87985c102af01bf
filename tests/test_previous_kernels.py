"""The snapshots under previous_kernels/ are complete: sources, a STEP.md, and a kernels.txt whose
configurations parse and are valid (the snapshot builder compiles exactly those)."""

import pathlib
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "previous_kernels"))

import build_snapshot  # noqa: E402

SNAPSHOTS = sorted(path for path in (REPO_ROOT / "previous_kernels").iterdir() if path.is_dir())


def test_there_is_a_first_snapshot():
    assert SNAPSHOTS and SNAPSHOTS[0].name == "01_base"


@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=lambda path: path.name)
def test_snapshot_is_complete(snapshot):
    assert (snapshot / "STEP.md").read_text().strip()
    assert (snapshot / "src" / "flash_attention.cu").is_file()
    assert (snapshot / "src" / "include" / "forward_kernel.cuh").is_file()
    assert not (snapshot / "src" / "include" / "flash_kernels.cuh").exists(), "generated files are not snapshotted"
    configs = build_snapshot.snapshot_configs(snapshot)
    assert configs, "kernels.txt names no configuration"
    for cfg in configs:
        assert cfg.validity_error() is None, f"{cfg.short_form()}: {cfg.validity_error()}"


def test_snapshot_directories_are_numbered_in_order():
    numbers = [int(path.name.split("_", 1)[0]) for path in SNAPSHOTS]
    assert numbers == list(range(1, len(SNAPSHOTS) + 1))
