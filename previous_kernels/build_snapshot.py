#!/usr/bin/env python3
"""Build steps of the kernel's history as their own extension modules.

    python previous_kernels/build_snapshot.py STEP [STEP ...] [--check]

A step is a directory ``previous_kernels/NN_name/`` holding a ``STEP.md`` (what changed, why, what
was measured), a ``kernels.txt`` (the configurations it is measured with, one short form a line)
and its sources in one of two ways:

- ``src/``: the C++/CUDA tree of that milestone (a source snapshot);
- ``SOURCE``: one line naming the step whose ``src/`` it is built from, for a step that was an
  optimisation knob of an existing tree (a configuration snapshot).

One module is compiled per source tree, as ``flash_attention_<NN_name of the tree>``, holding the
configurations of every step built from that tree, so those steps share one build. The sources are
copied to a cache directory, the kernel map and instantiation units are generated there with
tools/build/generate_kernel_instantiations.py, and the module is compiled once (later calls reuse the
cache); it has the same ``forward(kernel_cfg, q, k, v, o=None, benchmark=False)`` as the main
module. STEP may be a directory name or its number (``3``, ``03``). Build on a GPU machine's
architecture with TORCH_CUDA_ARCH_LIST (default: the GPU it finds) and MAX_JOBS parallel compiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import pathlib
import shutil
import sys

SNAPSHOTS_DIR = pathlib.Path(__file__).resolve().parent
REPO_ROOT = SNAPSHOTS_DIR.parent
sys.path[:0] = [str(REPO_ROOT / "py"), str(REPO_ROOT / "tools" / "build")]

from flash_helpers.kernel_configs import FlashForwardKernelConfig, parse_kernel_name_into_config  # noqa: E402
from generate_kernel_instantiations import generate  # noqa: E402

DEFAULT_CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "flash_attention_snapshots"
SOURCE_FILE = "SOURCE"
# The main module's compiler flags (setup.py), plus hidden symbols: they keep each module's
# kernel instantiations its own when several modules share one process.
CXX_FLAGS = ["-O3", "-std=c++20", "-fvisibility=hidden"]
NVCC_FLAGS = [
    "-O3", "-std=c++20", "-lineinfo", "-diag-suppress=3189", "--expt-relaxed-constexpr", "-Xcompiler", "-fvisibility=hidden",
]  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Step:
    name: str  # the directory name, NN_short_name
    source: str  # the step whose src/ this step is built from (its own name for a source snapshot)
    title: str  # what changed, from STEP.md's heading
    configs: tuple[FlashForwardKernelConfig, ...]

    @property
    def number(self) -> int:
        return int(self.name.split("_", 1)[0])

    @property
    def path(self) -> pathlib.Path:
        return SNAPSHOTS_DIR / self.name

    @property
    def module_name(self) -> str:
        return module_name(self.source)


def module_name(source: str) -> str:
    return f"flash_attention_{source}"


def read_configs(path: pathlib.Path) -> tuple[FlashForwardKernelConfig, ...]:
    """The configurations of a kernels.txt file: one short form a line; '#' starts a comment line."""
    lines = path.read_text().splitlines()
    return tuple(parse_kernel_name_into_config(line) for line in lines if line.strip() and not line.startswith("#"))


def read_step(path: pathlib.Path) -> Step:
    if (path / "src").is_dir():
        source = path.name
    elif (path / SOURCE_FILE).is_file():
        source = (path / SOURCE_FILE).read_text().strip()
        if not (SNAPSHOTS_DIR / source / "src").is_dir():
            raise FileNotFoundError(f"{path / SOURCE_FILE} names {source!r}, which has no src/ directory")
    else:
        raise FileNotFoundError(f"{path} is not a step: it has neither src/ nor a {SOURCE_FILE} file")
    heading = (path / "STEP.md").read_text().splitlines()[0].lstrip("# ").strip()
    title = heading.split(":", 1)[1].strip() if ":" in heading else heading
    return Step(path.name, source, title, read_configs(path / "kernels.txt"))


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


def source_configs(source: str) -> list[FlashForwardKernelConfig]:
    """The configurations compiled into a source tree's module: those of every step built from it."""
    return sorted({cfg for step in all_steps() if step.source == source for cfg in step.configs})


def build(source: str, cache_dir: pathlib.Path = DEFAULT_CACHE, verbose: bool = False):
    """Compile (or load from the cache) the module of the source tree of step ``source``."""
    from torch.utils.cpp_extension import load

    build_src = cache_dir / source / "src"
    shutil.copytree(SNAPSHOTS_DIR / source / "src", build_src, dirs_exist_ok=True)
    units = generate(source_configs(source), build_src, source)
    build_dir = cache_dir / source / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=module_name(source),
        sources=[str(build_src / "flash_attention.cu"), *map(str, units)],
        extra_include_paths=[str(build_src / "include")],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=str(build_dir),
        verbose=verbose,
    )


def check(module, configs) -> bool:
    """Runs each configuration once against the float32 reference (the tests' criterion)."""
    import torch

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
    parser.add_argument("steps", nargs="+", metavar="STEP", help="step directory names or numbers, or 'all'")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    parser.add_argument("--check", action="store_true", help="run each step's configs once against float32 attention")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    try:
        steps = list(all_steps()) if args.steps == ["all"] else [find_step(key) for key in args.steps]
    except ValueError as error:
        parser.error(str(error))
    ok = True
    for step in steps:
        module = build(step.source, args.cache_dir, args.verbose)
        print(f"{step.name}: built {module.__name__} ({len(module.compiled_configs())} kernels)")
        if args.check:
            ok &= check(module, step.configs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
