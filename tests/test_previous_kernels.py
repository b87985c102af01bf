"""The steps under previous_kernels/ are complete: a STEP.md whose heading names the step, a
kernels.txt whose configurations parse and are valid, and sources: their own src/ tree without
generated files, or a SOURCE file naming an earlier step that has one."""

import pathlib
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "previous_kernels"))

import build_snapshot  # noqa: E402
from flash_helpers.kernel_configs import DType  # noqa: E402

STEPS = build_snapshot.all_steps()
STEP_DIRS = sorted(
    path
    for path in (REPO_ROOT / "previous_kernels").iterdir()
    if path.is_dir() and any(entry.is_file() for entry in path.rglob("*"))
)


def test_every_directory_is_a_step_and_the_first_is_the_base_kernel():
    assert [step.name for step in STEPS] == [path.name for path in STEP_DIRS]
    assert STEPS[0].name == "01_base" and STEPS[0].source == "01_base"


def test_steps_are_numbered_in_order():
    assert [step.number for step in STEPS] == list(range(1, len(STEPS) + 1))


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.name)
def test_step_is_complete(step):
    heading = (step.path / "STEP.md").read_text().splitlines()[0]
    number = step.name.split("_", 1)[0]
    assert heading.startswith(f"# {number} "), "STEP.md's heading starts with the step's number"
    assert step.title, "STEP.md's heading says what changed after a ':'"
    src = build_snapshot.SNAPSHOTS_DIR / step.source / "src"
    assert (src / "flash_attention.cu").is_file()
    assert (src / "include" / "forward_kernel.cuh").is_file()
    assert not (src / "include" / "flash_kernels.cuh").exists(), "generated files are not snapshotted"
    assert not (src / "instantiations").exists(), "generated files are not snapshotted"
    if step.source != step.name:
        assert not (step.path / "src").exists(), "a step has its own src/ or a SOURCE file, not both"
    for cfg in step.configs:
        assert cfg.validity_error() is None, f"{cfg.short_form()}: {cfg.validity_error()}"
    # The progression measures every step at d_head 128 in either dtype.
    assert {cfg.dtype for cfg in step.configs if cfg.d_head == 128} == {DType.FP16, DType.BF16}


def test_a_tree_compiles_the_configurations_of_every_step_built_from_it():
    knob_steps = [step for step in STEPS if step.source == "07_optimized_softmax"]
    assert len(knob_steps) > 1
    assert build_snapshot.source_configs("07_optimized_softmax") == sorted(
        {cfg for step in knob_steps for cfg in step.configs}
    )


@pytest.mark.parametrize("key", ["3", "03", "03_swizzled"])
def test_steps_are_found_by_name_or_number(key):
    assert build_snapshot.find_step(key).name == "03_swizzled"


def test_an_unknown_step_is_named_in_the_error():
    with pytest.raises(ValueError, match="no step '42'"):
        build_snapshot.find_step("42")


def test_an_empty_leftover_directory_is_not_a_step(tmp_path, monkeypatch):
    (tmp_path / "01_base").symlink_to(build_snapshot.SNAPSHOTS_DIR / "01_base", target_is_directory=True)
    (tmp_path / "02_renamed_away" / "src" / "include").mkdir(parents=True)
    monkeypatch.setattr(build_snapshot, "SNAPSHOTS_DIR", tmp_path)
    build_snapshot.all_steps.cache_clear()
    try:
        assert [step.name for step in build_snapshot.all_steps()] == ["01_base"]
    finally:
        build_snapshot.all_steps.cache_clear()
