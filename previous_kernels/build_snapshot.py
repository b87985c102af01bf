#!/usr/bin/env python3
"""Build one snapshot of the kernel's history as its own extension module.

    python previous_kernels/build_snapshot.py 01_base [--check]

A snapshot is a directory ``previous_kernels/NN_name/`` holding the C++/CUDA sources of one
milestone (``src/``), the configurations to compile for it (``kernels.txt``, one short form a line)
and ``STEP.md``. The sources are copied to a cache directory, the kernel map and instantiation
units are generated there with tools/build/generate_kernel_instantiations.py, and the module is
compiled (once; later calls reuse the cache) as ``flash_attention_<NN_name>``, with the same
``forward(kernel_cfg, q, k, v, o=None, benchmark=False)`` as the main module. Build it on a GPU
machine's architecture with TORCH_CUDA_ARCH_LIST (default: the GPU it finds).
"""

from __future__ import annotations

import argparse
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


def snapshot_configs(snapshot: pathlib.Path) -> list[FlashForwardKernelConfig]:
    lines = (snapshot / "kernels.txt").read_text().splitlines()
    return [parse_kernel_name_into_config(line) for line in lines if line.strip() and not line.startswith("#")]


def build(name: str, cache_dir: pathlib.Path = DEFAULT_CACHE, verbose: bool = False):
    """Compile (or load from the cache) the snapshot ``name`` and return its module."""
    from torch.utils.cpp_extension import load

    snapshot = SNAPSHOTS_DIR / name
    if not (snapshot / "src").is_dir():
        raise FileNotFoundError(f"{snapshot} is not a snapshot: it has no src/ directory")
    build_src = cache_dir / name / "src"
    shutil.copytree(snapshot / "src", build_src, dirs_exist_ok=True)
    units = generate(snapshot_configs(snapshot), build_src, name)
    build_dir = cache_dir / name / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=f"flash_attention_{name}",
        sources=[str(build_src / "flash_attention.cu"), *map(str, units)],
        extra_include_paths=[str(build_src / "include")],
        extra_cflags=["-O3", "-std=c++20"],
        extra_cuda_cflags=["-O3", "-std=c++20", "-lineinfo", "-diag-suppress=3189", "--expt-relaxed-constexpr"],
        build_directory=str(build_dir),
        verbose=verbose,
    )


def check(module, configs: list[FlashForwardKernelConfig]) -> bool:
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("snapshot", help="directory name under previous_kernels/, e.g. 01_base")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=DEFAULT_CACHE)
    parser.add_argument("--check", action="store_true", help="run each config once against the float32 reference")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    module = build(args.snapshot, args.cache_dir, args.verbose)
    print(f"built {module.__name__}: {len(module.compiled_configs())} kernels")
    if args.check:
        return 0 if check(module, snapshot_configs(SNAPSHOTS_DIR / args.snapshot)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
