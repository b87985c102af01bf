#!/usr/bin/env python3
"""Build steps of the kernel's history as their own extension modules.

    python previous_kernels/build_snapshot.py STEP [STEP ...] [--check]
    python previous_kernels/build_snapshot.py --materialize STEP DIR
    python previous_kernels/build_snapshot.py --diff STEP DIR

A step is a directory ``previous_kernels/NN_name/`` holding a ``STEP.md`` (what changed, why, what
was measured), a ``kernels.txt`` (the configurations it is measured with, one short form a line)
and its sources in one of two ways:

- ``changes.patch`` (a source step): a unified diff from the tree of the source step before it to
  this step's tree; 01_base's patch creates its whole tree. A step's tree is the patches of every
  source step up to it applied in order. It holds ``src/`` (the kernel and its binding), and the
  configuration code and generator the step was measured with: ``py/flash_helpers/`` and
  ``tools/build/generate_kernel_instantiations.py``. So a step builds with its own code only,
  whatever today's src/, py/ and tools/ hold.
- ``SOURCE`` (a configuration step): names the source step whose tree it is built from, for a step
  that was an optimisation knob of an existing tree.

One module is compiled per source tree, as ``flash_attention_<NN_name of the tree>``, holding the
configurations of every step built from that tree, so those steps share one build. The tree is
written to a cache directory named after the hash of its patches (a changed patch never reuses a
stale tree; an unchanged one keeps its files, so builds stay incremental), the tree's own generator
writes the kernel map and instantiation units there for the configurations kernels.txt lists (read
with the tree's own configuration code), and the module is compiled once (later calls reuse the
cache). It has the same ``forward(kernel_cfg, q, k, v, o=None, benchmark=False)`` as the main
module, taking configurations of the tree's own class (``Tree.step_configs``). STEP may be a
directory name or its number (``3``, ``03``). Build on a GPU machine's architecture with
TORCH_CUDA_ARCH_LIST (default: the GPU it finds) and MAX_JOBS parallel compiles.

``--materialize STEP DIR`` writes STEP's tree (for a configuration step: the tree it is built from)
to the new or empty directory DIR, to read or build by hand. ``--diff STEP DIR`` prints the patch
from STEP's tree to the tree in DIR: the ``changes.patch`` of a new source step after STEP (it runs
git; applying patches does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterable

SNAPSHOTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = SNAPSHOTS_DIR.parent
if str(SNAPSHOTS_DIR) not in sys.path:
    sys.path.insert(0, str(SNAPSHOTS_DIR))

from unified_diff import apply_patch  # noqa: E402

DEFAULT_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "flash_attention_snapshots"
PATCH_FILE = "changes.patch"
# The Hopper family's steps are configurations of today's tree, not trees: this directory holds
# only their STEP.md files (NN_<step name>/STEP.md), numbered after the steps here.
HOPPER_STEPS_DIR = SNAPSHOTS_DIR / "hopper"
SOURCE_FILE = "SOURCE"
KERNELS_FILE = "kernels.txt"
# Paths inside a tree.
GENERATOR = "tools/build/generate_kernel_instantiations.py"
KERNEL_CONFIGS = "py/flash_helpers/kernel_configs.py"
# What the generator writes into a tree's src/: never part of a step.
GENERATED = ("src/include/flash_kernels.cuh", "src/instantiations/")
# The main module's compiler flags (setup.py), plus hidden symbols: they keep each module's
# kernel instantiations its own when several modules share one process.
CXX_FLAGS = ["-O3", "-std=c++20", "-fvisibility=hidden"]
NVCC_FLAGS = [
    "-O3", "-std=c++20", "-lineinfo", "-diag-suppress=3189", "--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden",
]  # fmt: skip


# ----------------------------------------------------------------------------------------------
# Steps


@dataclasses.dataclass(frozen=True)
class Step:
    name: str  # the directory name, NN_short_name
    source: str  # the source step whose tree this step is built from (its own name for a source step)
    title: str  # what changed, from STEP.md's heading
    kernels: tuple[str, ...]  # kernels.txt's configurations as written; parsed by the tree: Tree.step_configs

    @property
    def number(self) -> int:
        return int(self.name.split("_", 1)[0])

    @property
    def path(self) -> pathlib.Path:
        return SNAPSHOTS_DIR / self.name

    @property
    def is_source_step(self) -> bool:
        return self.source == self.name

    @property
    def module_name(self) -> str:
        return module_name(self.source)


def module_name(source: str) -> str:
    return f"flash_attention_{source}"


def _content_lines(path: pathlib.Path) -> list[str]:
    """The lines of a step's text file that are neither empty nor a '#' comment."""
    return [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def read_kernels(path: pathlib.Path) -> tuple[str, ...]:
    """The configurations of a kernels.txt file as written: one short form a line; '#' starts a comment."""
    return tuple(_content_lines(path))


def read_step(path: pathlib.Path) -> Step:
    has_patch, has_source = (path / PATCH_FILE).is_file(), (path / SOURCE_FILE).is_file()
    if has_patch and has_source:
        raise ValueError(f"{path} has both {PATCH_FILE} and {SOURCE_FILE}: a step is one or the other")
    if has_patch:
        source = path.name
    elif has_source:
        names = _content_lines(path / SOURCE_FILE)
        if len(names) != 1:
            raise ValueError(f"{path / SOURCE_FILE} must name one step, not {len(names)}")
        source = names[0]
        if not (SNAPSHOTS_DIR / source / PATCH_FILE).is_file():
            raise FileNotFoundError(
                f"{path / SOURCE_FILE} names {source!r}, which is not a source step (it has no {PATCH_FILE})"
            )
    else:
        raise FileNotFoundError(f"{path} is not a step: it has neither {PATCH_FILE} nor a {SOURCE_FILE} file")
    heading = (path / "STEP.md").read_text().splitlines()[0].lstrip("# ").strip()
    title = heading.split(":", 1)[1].strip() if ":" in heading else heading
    return Step(path.name, source, title, read_kernels(path / KERNELS_FILE))


def _holds_files(path: pathlib.Path) -> bool:
    return any(entry.is_file() for entry in path.rglob("*"))


@functools.cache
def all_steps() -> tuple[Step, ...]:
    """Every step, in order. Numbered directories holding no file at all are skipped: git leaves such
    empty trees behind where a renamed step used to be."""
    return tuple(
        read_step(path)
        for path in sorted(SNAPSHOTS_DIR.iterdir())
        if path.is_dir() and path.name[:2].isdigit() and _holds_files(path)
    )


def find_step(key: str) -> Step:
    """The step named ``key``: its directory name, or its number."""
    for step in all_steps():
        if key in (step.name, str(step.number), f"{step.number:02d}"):
            return step
    names = ", ".join(step.name for step in all_steps())
    raise ValueError(f"no step {key!r} under previous_kernels/; the steps are {names}")


def source_steps() -> list[Step]:
    """The steps with a patch, in order: applied one after the other, they give every tree."""
    return [step for step in all_steps() if step.is_source_step]


# ----------------------------------------------------------------------------------------------
# Trees


def _patches_up_to(source: str) -> list[Step]:
    steps = source_steps()
    names = [step.name for step in steps]
    if source not in names:
        raise ValueError(f"{source!r} is not a source step; the source steps are {', '.join(names)}")
    return steps[: names.index(source) + 1]


def tree_files(source: str) -> dict[str, bytes]:
    """The tree of source step ``source`` (relative path -> content): the patches of every source
    step up to it applied in order to an empty tree. Raises PatchError if one does not apply."""
    files: dict[str, bytes] = {}
    for step in _patches_up_to(source):
        files = apply_patch(files, (step.path / PATCH_FILE).read_bytes(), f"{step.name}/{PATCH_FILE}")
    return files


def tree_key(source: str) -> str:
    """A hash of the patches that make the tree: the cache directory's name changes with any of them."""
    digest = hashlib.sha256()
    for step in _patches_up_to(source):
        for part in (step.name.encode(), (step.path / PATCH_FILE).read_bytes()):
            digest.update(b"%d:" % len(part) + part)
    return digest.hexdigest()[:16]


def _is_generated(relative: str) -> bool:
    return relative in GENERATED or any(relative.startswith(d) for d in GENERATED if d.endswith("/"))


def _is_cache(relative: str) -> bool:
    return "__pycache__" in relative.split("/")


def _safe_path(root: pathlib.Path, relative: str) -> pathlib.Path:
    parts = relative.split("/")
    if relative.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"refusing to write {relative!r}: not a plain relative path")
    return root.joinpath(*parts)


def write_tree(files: dict[str, bytes], root: pathlib.Path) -> None:
    """Makes the directory ``root`` hold the tree ``files``: writes each file whose content differs (so
    unchanged files keep their mtimes and builds stay incremental) and deletes any other file, except
    what the generator writes and Python's bytecode caches."""
    root.mkdir(parents=True, exist_ok=True)
    for relative, data in files.items():
        path = _safe_path(root, relative)
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_bytes(data)
        os.replace(partial, path)
    for path in list(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and relative not in files and not _is_generated(relative) and not _is_cache(relative):
            path.unlink()


def read_tree_dir(root: pathlib.Path) -> dict[str, bytes]:
    """The files of a tree on disk, without generated files and bytecode caches."""
    return {
        relative: path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and not _is_generated(relative := path.relative_to(root).as_posix())
        and not _is_cache(relative)
    }


def _load_module_file(path: pathlib.Path, prefix: str):
    """Imports a Python file under a name unique to its content, registered in sys.modules (dataclasses
    need that); trees whose file is identical share the module."""
    name = f"{prefix}_{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


@dataclasses.dataclass(frozen=True)
class Tree:
    """A source step's tree written to a directory."""

    source: str
    root: pathlib.Path

    @property
    def src(self) -> pathlib.Path:
        return self.root / "src"

    @functools.cached_property
    def kernel_configs(self):
        """The tree's own flash_helpers.kernel_configs module (not today's py/flash_helpers)."""
        return _load_module_file(self.root / KERNEL_CONFIGS, "previous_kernels_kernel_configs")

    def parse(self, kernels: Iterable[str]) -> tuple:
        """Short forms (or any form the tree's parser reads) as configurations of the tree's own class."""
        return tuple(self.kernel_configs.parse_kernel_name_into_config(text) for text in kernels)

    def step_configs(self, step: Step) -> tuple:
        """The configurations ``step`` is measured with, as the tree's own configuration objects."""
        if step.source != self.source:
            raise ValueError(f"{step.name} is built from {step.source}, not from {self.source}")
        return self.parse(step.kernels)

    def configs(self) -> list:
        """The configurations compiled into the tree's module: those of every step built from it."""
        return sorted({cfg for step in all_steps() if step.source == self.source for cfg in self.step_configs(step)})

    def generate(self) -> list[pathlib.Path]:
        """Runs the tree's own generator for ``configs()`` (in a fresh interpreter that sees no
        PYTHONPATH, so it imports the tree's flash_helpers); returns the instantiation units."""
        kernels = ";".join(cfg.short_form() for cfg in self.configs())
        command = [sys.executable, "-I", str(self.root / GENERATOR), "--kernels", kernels, "--src-dir", str(self.src)]
        env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
        subprocess.run(command, check=True, env=env)
        return sorted((self.src / "instantiations").glob("*.cu"))


def source_tree(source: str, cache_dir: pathlib.Path = DEFAULT_CACHE) -> Tree:
    """The tree of source step ``source``, written to (or found up to date in) the cache directory
    ``cache_dir/<source>-<hash of its patches>/tree``."""
    root = cache_dir / f"{source}-{tree_key(source)}" / "tree"
    write_tree(tree_files(source), root)
    return Tree(source, root)


def materialize(step: Step, dest: pathlib.Path) -> Tree:
    """Writes the tree ``step`` is built from to ``dest``, a new or empty directory."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise FileExistsError(f"{dest} exists and is not an empty directory")
    write_tree(tree_files(step.source), dest)
    return Tree(step.source, dest)


def diff_trees(old: dict[str, bytes], new: dict[str, bytes]) -> bytes:
    """The patch from tree ``old`` to tree ``new``, as git writes it (``a/``, ``b/`` prefixes, paths
    relative to the trees' roots, no renames). Needs git; applying the patch does not."""
    with tempfile.TemporaryDirectory() as scratch:
        for side, files in (("a", old), ("b", new)):
            write_tree(files, pathlib.Path(scratch, side))
        command = [
            "git", "-c", "core.quotePath=false", "-c", "diff.mnemonicPrefix=false",
            "-c", "diff.suppressBlankEmpty=false",
            "diff", "--no-index", "--no-renames", "--no-prefix", "--no-color", "--no-ext-diff", "--no-textconv",
            "--diff-algorithm=myers", "--unified=3", "a", "b",
        ]  # fmt: skip
        result = subprocess.run(command, cwd=scratch, capture_output=True)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"git diff failed: {result.stderr.decode(errors='replace')}")
    # Without prefixes git names a file that one side lacks by the other side's directory twice
    # ("diff --git b/P b/P"); name it as git does in a repository. Only section headers start so.
    lines = result.stdout.split(b"\n")
    for number, line in enumerate(lines):
        if line.startswith(b"diff --git "):
            path = line[len(b"diff --git ") :].split(b" ", 1)[0][2:]
            lines[number] = b"diff --git a/%s b/%s" % (path, path)
    return b"\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Building and checking


def build(source: str, cache_dir: pathlib.Path = DEFAULT_CACHE, verbose: bool = False):
    """Compile (or load from the cache) the module of the tree of source step ``source``."""
    from torch.utils.cpp_extension import load

    tree = source_tree(source, cache_dir)
    units = tree.generate()
    build_dir = tree.root.parent / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=module_name(source),
        sources=[str(tree.src / "flash_attention.cu"), *map(str, units)],
        extra_include_paths=[str(tree.src / "include")],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=str(build_dir),
        verbose=verbose,
    )


def check(module, configs) -> bool:
    """Runs each configuration once against the float32 reference (the tests' criterion)."""
    import torch

    if str(REPO_ROOT / "py") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "py"))
    from flash_helpers.reference import FloatReference

    ok = True
    for cfg in configs:
        dtype = cfg.dtype.to_torch_dtype()
        q, k, v = (torch.randn(2, 512, 3, cfg.d_head, device="cuda", dtype=dtype) for _ in range(3))
        out, _ = module.forward(cfg, q, k, v)
        comparison = FloatReference(q, k, v).compare(out)
        ok &= comparison.passed
        print(
            f"{cfg.short_form()}: {'ok' if comparison.passed else 'FAILED'}, max error {comparison.max_error:.2e} "
            f"(allowed {comparison.tolerance:.2e}), relative norm error {comparison.relative_norm_error:.2e}"
        )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[2:]),
    )  # fmt: skip
    parser.add_argument("steps", nargs="*", metavar="STEP", help="step directory names or numbers, or 'all'")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    parser.add_argument("--check", action="store_true", help="run each step's configs once against float32 attention")
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument(
        "--materialize", nargs=2, metavar=("STEP", "DIR"), help="write the tree STEP is built from to DIR, and exit"
    )
    parser.add_argument(
        "--diff", nargs=2, metavar=("STEP", "DIR"), help="print the patch from STEP's tree to the tree in DIR, and exit"
    )
    args = parser.parse_args()
    if bool(args.steps) + bool(args.materialize) + bool(args.diff) != 1:
        parser.error("give steps to build, or --materialize STEP DIR, or --diff STEP DIR")
    try:
        if args.materialize or args.diff:
            key, directory = args.materialize or args.diff
            step, directory = find_step(key), pathlib.Path(directory)
        else:
            steps = list(all_steps()) if args.steps == ["all"] else [find_step(key) for key in args.steps]
    except ValueError as error:
        parser.error(str(error))
    if args.materialize:
        try:
            tree = materialize(step, directory)
        except FileExistsError as error:
            parser.error(str(error))
        configs = ";".join(cfg.short_form() for cfg in tree.step_configs(step))
        print(f"wrote the tree of {step.source} to {directory}; generate {step.name}'s kernels in it with")
        print(f"  python {directory / GENERATOR} --kernels '{configs}' --src-dir {directory / 'src'}")
        return 0
    if args.diff:
        sys.stdout.buffer.write(diff_trees(tree_files(step.source), read_tree_dir(directory)))
        return 0
    ok = True
    for step in steps:
        module = build(step.source, args.cache_dir, args.verbose)
        print(f"{step.name}: built {module.__name__} ({len(module.compiled_configs())} kernels)")
        if args.check:
            ok &= check(module, source_tree(step.source, args.cache_dir).step_configs(step))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
