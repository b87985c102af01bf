"""The optimisation history of each family: its steps, each adding knobs to the one before, and
the configurations that measure them (``previous_kernels/``, ``tools/benchmark/progression.py``).
Importable without torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from flash_helpers import sm80_config, sm90_config
from flash_helpers.dtypes import DTYPES, DType, coerce_dtype
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = [
    "SM80_PROGRESSION_BLOCK",
    "SM80_PROGRESSION_STEPS",
    "SM90_PROGRESSION_BLOCK",
    "SM90_PROGRESSION_STEPS",
    "get_kernel_progression_configs",
    "get_progression_steps",
]

# The SM80 kernel's optimisation history: each step adds knobs to the previous one, in the order they
# were introduced. A step that is invalid at some block size is skipped there.
SM80_PROGRESSION_STEPS = [
    ("base", ""),
    ("async", "async"),
    ("swizzled", "async+swizzled"),
    ("eager", "async+eager+swizzled"),
    ("load_tiles", "async+eager+swizzled+load_1_1_1_tiles"),
    ("buffer", "async+eager+swizzled+load_1_1_1_tiles+buffer"),
    ("opt_softmax", "async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"),
]
# (B_r, B_c, n_warps) at which the SM80 progression is compared by default.
SM80_PROGRESSION_BLOCK = (128, 64, 4)
# The Hopper kernel's steps, in the same way: TMA and wgmma with the consumers issuing their own
# loads, then a producer warpgroup, then ping-pong scheduling of the consumers, then the overlap of
# softmax and P V inside a warpgroup, then persistent blocks, then Q held in registers.
SM90_PROGRESSION_STEPS = [
    ("hopper_base", ""),
    ("hopper_ws", "ws"),
    ("hopper_pingpong", "ws+pingpong"),
    ("hopper_overlap", "ws+pingpong+overlap"),
    ("hopper_persistent", "ws+pingpong+overlap+persistent"),
    ("hopper_qregs", "ws+pingpong+overlap+persistent+qregs"),
]
# (B_r, B_c, stages) at which the Hopper progression is compared by default; every block size of the
# progression has its number of stages.
SM90_PROGRESSION_BLOCK = (128, 128, 2)
# Per family: its steps, the block at which they are compared, and every block size.
_PROGRESSIONS = {
    FlashForwardKernelConfig: (
        SM80_PROGRESSION_STEPS,
        SM80_PROGRESSION_BLOCK,
        tuple(itertools.product(sm80_config.B_RS, sm80_config.B_CS, sm80_config.N_WARPS)),
    ),
    HopperForwardKernelConfig: (
        SM90_PROGRESSION_STEPS,
        SM90_PROGRESSION_BLOCK,
        tuple(
            (B_r, B_c, SM90_PROGRESSION_BLOCK[2])
            for B_r, B_c in itertools.product(sm90_config.B_RS, sm90_config.B_CS)
        ),
    ),
}


def get_progression_steps(
    cls: type[KernelConfig],
    all_block_sizes: bool = False,
    dtypes: Iterable[DType] = DTYPES,
    d_heads: Iterable[int] = (128,),
) -> list[tuple[str, list[KernelConfig]]]:
    """One family's progression, step by step in order: each step's name and its valid
    configurations at the family's progression block, or at every block size."""
    steps, block, all_blocks = _PROGRESSIONS[cls]
    shapes = list(itertools.product(dtypes, d_heads, all_blocks if all_block_sizes else [block]))
    progression = []
    for name, flags in steps:
        configs = []
        for dtype, d_head, block_size in shapes:
            head = cls(coerce_dtype(dtype), d_head, *block_size).short_form()
            configs.append(parse_kernel_name_into_config(f"{head}: {flags}" if flags else head))
        progression.append((name, sorted({cfg for cfg in configs if cfg.is_valid()})))
    return progression


def get_kernel_progression_configs(
    all_block_sizes: bool = False, dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = (128,)
) -> list[KernelConfig]:
    """Every family's valid progression steps at its progression block, or at every block size."""
    dtypes, d_heads = tuple(dtypes), tuple(d_heads)
    return sorted(
        {
            cfg
            for cls in _PROGRESSIONS
            for _, configs in get_progression_steps(cls, all_block_sizes, dtypes, d_heads)
            for cfg in configs
        }
    )
