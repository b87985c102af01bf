"""The steps under previous_kernels/ are complete and build on their own: a STEP.md whose heading
names the step, a kernels.txt whose configurations parse with the step's own configuration code and
are valid, and sources: a patch that applies exactly to the tree of the source step before it, or a
SOURCE file naming a source step. Each file of the history is stored once, and none is a copy of a
file of today's src/."""

import hashlib
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SNAPSHOTS_DIR = REPO_ROOT / "previous_kernels"
sys.path.insert(0, str(SNAPSHOTS_DIR))

import build_snapshot  # noqa: E402
import unified_diff  # noqa: E402

STEPS = build_snapshot.all_steps()
SOURCE_STEPS = [step for step in STEPS if step.is_source_step]
# Every directory but the Hopper steps' (STEP.md files only: tests/test_tools.py checks them).
STEP_DIRS = sorted(
    path
    for path in SNAPSHOTS_DIR.iterdir()
    if path.is_dir() and path != build_snapshot.HOPPER_STEPS_DIR and any(entry.is_file() for entry in path.rglob("*"))
)
# The commit whose previous_kernels/NN/src trees, configuration code and generator the patches reproduce.
ORIGIN_COMMIT = "820dea2"
TREE_TOOLS = ("py/flash_helpers/__init__.py", "py/flash_helpers/kernel_configs.py", build_snapshot.GENERATOR)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("snapshot_cache")


def history_files(root: pathlib.Path) -> list[pathlib.Path]:
    return sorted(path for path in root.rglob("*") if path.is_file() and "__pycache__" not in path.parts)


def test_every_directory_is_a_step_and_the_first_is_the_base_kernel():
    assert [step.name for step in STEPS] == [path.name for path in STEP_DIRS]
    assert STEPS[0].name == "01_base" and STEPS[0].is_source_step


def test_steps_are_numbered_in_order():
    assert [step.number for step in STEPS] == list(range(1, len(STEPS) + 1))


@pytest.mark.parametrize("step", STEPS, ids=lambda step: step.name)
def test_step_is_complete(step, cache_dir):
    heading = (step.path / "STEP.md").read_text().splitlines()[0]
    number = step.name.split("_", 1)[0]
    assert heading.startswith(f"# {number} "), "STEP.md's heading starts with the step's number"
    assert step.title, "STEP.md's heading says what changed after a ':'"
    assert not (step.path / "src").exists(), "a step's sources are a patch, not a copy"
    assert (step.path / build_snapshot.PATCH_FILE).is_file() == step.is_source_step
    assert (step.path / build_snapshot.SOURCE_FILE).is_file() == (not step.is_source_step)
    tree = build_snapshot.source_tree(step.source, cache_dir)
    configs = tree.step_configs(step)
    assert configs, "kernels.txt lists the configurations the step is measured with"
    for cfg in configs:
        assert type(cfg) is tree.kernel_configs.FlashForwardKernelConfig, "parsed by the tree's own code"
        assert cfg.validity_error() is None, f"{cfg.short_form()}: {cfg.validity_error()}"
    # The progression measures every step at d_head 128 in either dtype.
    assert {cfg.dtype.name for cfg in configs if cfg.d_head == 128} == {"FP16", "BF16"}


@pytest.mark.parametrize("step", SOURCE_STEPS, ids=lambda step: step.name)
def test_a_source_tree_holds_its_kernel_configuration_code_and_generator(step):
    files = build_snapshot.tree_files(step.name)
    for path in ("src/flash_attention.cu", "src/include/forward_kernel.cuh", *TREE_TOOLS):
        assert path in files, f"{step.name}'s tree lacks {path}"
    assert not any(build_snapshot._is_generated(path) for path in files), "generated files are not part of a step"
    assert all(path.startswith(("src/", "py/flash_helpers/", "tools/build/")) for path in files), sorted(files)


def test_the_first_patch_creates_the_tree_and_later_ones_change_it():
    assert build_snapshot.tree_files(SOURCE_STEPS[0].name), "01_base's patch creates its tree from nothing"
    for before, step in zip(SOURCE_STEPS, SOURCE_STEPS[1:]):
        old, new = build_snapshot.tree_files(before.name), build_snapshot.tree_files(step.name)
        changed = sorted(path for path in set(old) | set(new) if old.get(path) != new.get(path))
        patched = sorted(
            file_patch.path
            for file_patch in unified_diff.parse_patch((step.path / build_snapshot.PATCH_FILE).read_bytes())
        )
        assert changed and patched == changed, f"{step.name}'s patch touches exactly the files it changes"
        assert not any(path.startswith(("py/", "tools/")) for path in changed), (
            "every step was measured with the same configuration code and generator"
        )


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *args], capture_output=True)


def _origin_available() -> bool:
    try:
        return _git("cat-file", "-e", f"{ORIGIN_COMMIT}^{{commit}}").returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _origin_available(), reason=f"git history with commit {ORIGIN_COMMIT} is not available")
@pytest.mark.parametrize("step", SOURCE_STEPS, ids=lambda step: step.name)
def test_a_source_tree_is_the_code_the_step_was_measured_with(step):
    """The patches reproduce, byte for byte, the src/ copies and the generator and configuration code
    that the steps were stored and measured with before the history became patches."""
    prefix = f"previous_kernels/{step.name}/"
    listed = _git("ls-tree", "-r", "--name-only", ORIGIN_COMMIT, prefix + "src").stdout.decode().split()
    expected = {path[len(prefix) :]: path for path in listed}
    expected.update({path: path for path in TREE_TOOLS})
    files = build_snapshot.tree_files(step.name)
    assert sorted(files) == sorted(expected)
    for relative, origin_path in expected.items():
        assert files[relative] == _git("show", f"{ORIGIN_COMMIT}:{origin_path}").stdout, relative


def test_no_file_of_the_history_is_a_copy_of_a_file_of_src():
    src_digests = {hashlib.sha256(path.read_bytes()).digest(): path for path in history_files(REPO_ROOT / "src")}
    copies = [
        f"{path.relative_to(REPO_ROOT)} = {src_digests[digest].relative_to(REPO_ROOT)}"
        for path in history_files(SNAPSHOTS_DIR)
        if (digest := hashlib.sha256(path.read_bytes()).digest()) in src_digests
    ]
    assert not copies


def test_no_file_is_stored_twice_in_the_history():
    seen: dict[bytes, pathlib.Path] = {}
    twice = []
    for path in history_files(SNAPSHOTS_DIR):
        digest = hashlib.sha256(path.read_bytes()).digest()
        if digest in seen:
            twice.append(f"{path.relative_to(SNAPSHOTS_DIR)} = {seen[digest].relative_to(SNAPSHOTS_DIR)}")
        seen.setdefault(digest, path)
    assert not twice


def test_a_tree_compiles_the_configurations_of_every_step_built_from_it(cache_dir):
    knob_steps = [step for step in STEPS if step.source == "07_optimized_softmax"]
    assert len(knob_steps) > 1
    tree = build_snapshot.source_tree("07_optimized_softmax", cache_dir)
    assert tree.configs() == sorted({cfg for step in knob_steps for cfg in tree.step_configs(step)})


def test_the_trees_own_generator_writes_the_kernel_map(cache_dir):
    """The generator runs without torch and without today's py/ (it imports the tree's own
    flash_helpers); generated files are ignored when the tree is written again."""
    tree = build_snapshot.source_tree("01_base", cache_dir)
    units = tree.generate()
    assert [unit.name for unit in units] == sorted(f"forward_{cfg.file_stem()}.cu" for cfg in tree.configs())
    header = (tree.src / "include" / "flash_kernels.cuh").read_text()
    assert all(cfg.short_form() in header for cfg in tree.configs())
    assert build_snapshot.source_tree("01_base", cache_dir).root == tree.root
    assert (tree.src / "include" / "flash_kernels.cuh").is_file(), "rewriting the tree keeps generated files"


def test_the_cached_tree_is_repaired_and_named_after_its_patches(cache_dir):
    tree = build_snapshot.source_tree("08_lane_addresses", cache_dir)
    assert tree.root.parent.name == f"08_lane_addresses-{build_snapshot.tree_key('08_lane_addresses')}"
    assert build_snapshot.tree_key("08_lane_addresses") != build_snapshot.tree_key("07_optimized_softmax")
    kernel = tree.src / "include" / "forward_kernel.cuh"
    kernel.write_text("edited")
    (tree.src / "stray.h").write_text("left behind")
    build_snapshot.source_tree("08_lane_addresses", cache_dir)
    assert kernel.read_bytes() == build_snapshot.tree_files("08_lane_addresses")["src/include/forward_kernel.cuh"]
    assert not (tree.src / "stray.h").exists()


def test_a_step_materializes_for_reading(tmp_path):
    step = build_snapshot.find_step("11")
    tree = build_snapshot.materialize(step, tmp_path / "tree")
    assert tree.source == "10_lazy_rescale"
    assert build_snapshot.read_tree_dir(tree.root) == build_snapshot.tree_files("10_lazy_rescale")
    with pytest.raises(FileExistsError):
        build_snapshot.materialize(step, tmp_path / "tree")


def test_the_history_is_independent_of_todays_configuration_code(cache_dir):
    tree = build_snapshot.source_tree("10_lazy_rescale", cache_dir)
    module = tree.kernel_configs
    # Loaded from a written tree (trees whose configuration code is identical share the module).
    origin = pathlib.Path(module.__file__)
    assert origin.read_bytes() == (tree.root / build_snapshot.KERNEL_CONFIGS).read_bytes()
    assert origin.is_relative_to(cache_dir) and not origin.is_relative_to(REPO_ROOT)
    assert sys.modules[module.__name__] is module
    assert "flash_helpers" not in module.__name__


# ----------------------------------------------------------------------------------------------
# The patch applier

ORIGINAL = {"a.txt": b"one\ntwo\nthree\nfour\n", "tail.txt": b"x\ny"}


def _patch(text: str) -> bytes:
    return text.encode()


def test_the_applier_creates_changes_and_deletes_files():
    patch = _patch(
        "A description before the first file is ignored.\n"
        "diff --git a/a.txt b/a.txt\n"
        "--- a/a.txt\n+++ b/a.txt\n"
        "@@ -2,2 +2,3 @@\n two\n-three\n+THREE\n+3.5\n"
        "diff --git a/new.txt b/new.txt\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1,2 @@\n+hello\n+world\n\\ No newline at end of file\n"
        "diff --git a/tail.txt b/tail.txt\ndeleted file mode 100644\n"
        "--- a/tail.txt\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n\\ No newline at end of file\n"
    )
    result = unified_diff.apply_patch(ORIGINAL, patch, "test.patch")
    assert result == {"a.txt": b"one\ntwo\nTHREE\n3.5\nfour\n", "new.txt": b"hello\nworld"}
    assert ORIGINAL["a.txt"] == b"one\ntwo\nthree\nfour\n", "the input tree is left alone"


def test_the_applier_handles_a_missing_newline_at_the_end():
    patch = _patch("--- a/tail.txt\n+++ b/tail.txt\n@@ -2 +2,2 @@\n-y\n\\ No newline at end of file\n+y\n+z\n")
    assert unified_diff.apply_patch(ORIGINAL, patch)["tail.txt"] == b"x\ny\nz\n"


def test_the_applier_rejects_a_context_line_that_does_not_match():
    patch = _patch("diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -2,2 +2,2 @@\n TWO\n-three\n+3\n")
    with pytest.raises(unified_diff.PatchError, match=r"test\.patch: a\.txt: hunk 1 \(@@ -2,2 \+2,2 @@\).*line 2"):
        unified_diff.apply_patch(ORIGINAL, patch, "test.patch")


@pytest.mark.parametrize(
    ("patch", "problem"),
    [
        pytest.param("--- a/a.txt\n+++ b/a.txt\n@@ -3,2 +3,2 @@\n two\n-three\n+3\n", "does not apply", id="moved"),
        pytest.param("--- a/a.txt\n+++ b/a.txt\n@@ -2,2 +2,2 @@\n two\n-three\n", "ends after", id="short hunk"),
        pytest.param("--- /dev/null\n+++ b/a.txt\n@@ -0,0 +1 @@\n+a\n", "already exists", id="created twice"),
        pytest.param("--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-a\n+b\n", "no such file", id="missing file"),
        pytest.param("--- a/a.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-one\n", "does not remove", id="partial delete"),
        pytest.param("--- a/a.txt\n+++ b/c.txt\n@@ -1 +1 @@\n-one\n+1\n", "renames are not supported", id="rename"),
        pytest.param(
            "diff --git a/a.txt b/a.txt\nindex 1234567..89abcde 100644\n"
            "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+1\n",
            "blob",
            id="other blob",
        ),
        pytest.param(
            "diff --git a/a.txt b/a.txt\nold mode 100644\nnew mode 100755\n", "unsupported header", id="mode change"
        ),
    ],
)
def test_the_applier_is_strict(patch, problem):
    with pytest.raises(unified_diff.PatchError, match=problem):
        unified_diff.apply_patch(ORIGINAL, _patch(patch), "test.patch")


def test_the_applier_checks_the_blob_ids_git_wrote():
    before, after = ORIGINAL["a.txt"], b"1\ntwo\nthree\nfour\n"
    index = f"index {unified_diff.git_blob_id(before)[:7]}..{unified_diff.git_blob_id(after)[:7]} 100644"
    patch = _patch(f"diff --git a/a.txt b/a.txt\n{index}\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-one\n+1\n")
    assert unified_diff.apply_patch(ORIGINAL, patch)["a.txt"] == after


# ----------------------------------------------------------------------------------------------
# Finding steps


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
