"""Named sets of configurations: what the build compiles (``FLASH_BUILD_KERNELS``) and what the tests
and tools run (``KERNELS``). Importable without torch.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Iterable

from flash_helpers.dtypes import DTYPES, DType, coerce_dtype
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import ALL_VARIANTS, BENCHMARK_VARIANTS, ProblemVariant
from flash_helpers.sm80_config import B_CS, B_RS, D_HEADS, LOAD_TILES, N_WARPS, SHORT_FORM_EXAMPLE, FlashForwardKernelConfig

__all__ = [
    "BUILD_KERNELS_ENV",
    "DEFAULT_BUILD_KERNELS",
    "KERNELS_ENV",
    "PROGRESSION_BLOCK_SIZE",
    "PROGRESSION_STEPS",
    "REBUILD_HINT",
    "get_all_kernel_configs",
    "get_autotuning_kernel_configs",
    "get_kernel_configs",
    "get_kernel_progression_configs",
    "get_kernels_to_build",
    "resolve_build_kernels_key",
    "should_autotune_config",
    "variants_to_build",
]

_BOOLS = (False, True)


def _sorted_unique(configs: Iterable[FlashForwardKernelConfig]) -> list[FlashForwardKernelConfig]:
    return sorted(set(configs))


@functools.cache
def _valid_configs(dtypes: tuple[DType, ...], d_heads: tuple[int, ...]) -> tuple[FlashForwardKernelConfig, ...]:
    """Every valid configuration with these dtypes and head sizes (the product is large: cached)."""
    product = itertools.product(
        dtypes, d_heads, B_RS, B_CS, N_WARPS, _BOOLS, _BOOLS, _BOOLS, LOAD_TILES, LOAD_TILES, LOAD_TILES, _BOOLS, _BOOLS
    )
    return tuple(_sorted_unique(cfg for cfg in itertools.starmap(FlashForwardKernelConfig, product) if cfg.is_valid()))


def get_all_kernel_configs() -> list[FlashForwardKernelConfig]:
    """Every valid configuration over the whole configuration space."""
    return list(_valid_configs(DTYPES, D_HEADS))


def should_autotune_config(cfg: FlashForwardKernelConfig) -> bool:
    """Whether an autotuning sweep should try ``cfg``, on top of it being valid.

    The sweep varies what trades off against the register budget and the block shape: B_r, B_c,
    n_warps, whether Q stays in registers, and the K and V chunk sizes. The knobs that only remove
    work are always on (the progression measures each of them on its own): async copies, eager
    K/V loads, the swizzled layout, double-buffered fragment loads and the optimized softmax.
    K and V are always loaded in chunks of 1 or 2 k-slices: whole operands need more registers
    than a thread has for any block shape worth tuning.
    """
    return (
        cfg.is_valid()
        and cfg.async_copy
        and cfg.eager_load_blocks
        and cfg.swizzled
        and cfg.mma_double_buffer_loads
        and cfg.optimized_softmax
        and cfg.K_mma_load_K_tiles in (1, 2)
        and cfg.V_mma_load_K_tiles in (1, 2)
    )


def get_autotuning_kernel_configs(
    dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = D_HEADS
) -> list[FlashForwardKernelConfig]:
    """The autotuning space: valid configurations that pass ``should_autotune_config``."""
    configs = _valid_configs(tuple(coerce_dtype(dtype) for dtype in dtypes), tuple(d_heads))
    return [cfg for cfg in configs if should_autotune_config(cfg)]


# The kernel's optimisation history: each step adds knobs to the previous one, in the order they
# were introduced. A step that is invalid at some block size is skipped there.
PROGRESSION_STEPS = [
    ("base", ""),
    ("async", "async"),
    ("swizzled", "async+swizzled"),
    ("eager", "async+eager+swizzled"),
    ("load_tiles", "async+eager+swizzled+load_1_1_1_tiles"),
    ("buffer", "async+eager+swizzled+load_1_1_1_tiles+buffer"),
    ("opt_softmax", "async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"),
]
# (B_r, B_c, n_warps) at which the progression is compared by default.
PROGRESSION_BLOCK_SIZE = (128, 64, 4)


def get_kernel_progression_configs(
    all_block_sizes: bool = False, dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = (128,)
) -> list[FlashForwardKernelConfig]:
    """The valid progression steps at ``PROGRESSION_BLOCK_SIZE``, or at every block size."""
    block_sizes = itertools.product(B_RS, B_CS, N_WARPS) if all_block_sizes else [PROGRESSION_BLOCK_SIZE]
    configs = []
    for dtype, d_head, (B_r, B_c, n_warps), (_, flags) in itertools.product(
        dtypes, d_heads, block_sizes, PROGRESSION_STEPS
    ):
        head = f"({coerce_dtype(dtype).name}, {d_head}, {B_r}, {B_c}, {n_warps})"
        configs.append(parse_kernel_name_into_config(f"{head}: {flags}" if flags else head))
    return _sorted_unique(cfg for cfg in configs if cfg.is_valid())


KERNELS_ENV = "KERNELS"
_NAMED_KERNEL_SETS: dict[str, Callable[[], list[FlashForwardKernelConfig]]] = {
    "all": get_all_kernel_configs,
    "prog": get_kernel_progression_configs,
    "progall": functools.partial(get_kernel_progression_configs, all_block_sizes=True),
    "tune": get_autotuning_kernel_configs,
}
_BLOCK_SIZES_KEY_RE = re.compile(r"(\d+)\s*,\s*(\d+)")


def get_kernel_configs(key: str | None = None) -> list[FlashForwardKernelConfig]:
    """The configurations a tool or test run should use, selected by ``key``.

    ``key`` defaults to the ``KERNELS`` environment variable, then to ``all``. It is a set name
    (``all``, ``prog``, ``progall``, ``tune``), ``B_r,B_c`` (the tuning set at those block sizes),
    or short forms separated by ``;`` (each must be a valid configuration).
    """
    if key is None:
        key = os.environ.get(KERNELS_ENV) or "all"
    return _select_configs(key, _NAMED_KERNEL_SETS)


def _select_configs(
    key: str, named_sets: dict[str, Callable[[], list[FlashForwardKernelConfig]]]
) -> list[FlashForwardKernelConfig]:
    key = key.strip()
    if "+" in key and "(" not in key and "{" not in key:
        # A union of sets, e.g. "tune+prog" (short forms contain "+" too, but also "(").
        return _sorted_unique(cfg for part in key.split("+") for cfg in _select_configs(part, named_sets))
    if key.lower() in named_sets:
        return named_sets[key.lower()]()
    block_sizes = _BLOCK_SIZES_KEY_RE.fullmatch(key)
    if block_sizes:
        B_r, B_c = map(int, block_sizes.groups())
        configs = [cfg for cfg in get_autotuning_kernel_configs() if (cfg.B_r, cfg.B_c) == (B_r, B_c)]
        if not configs:
            raise ValueError(f"kernel set {key!r}: no tuning configuration has B_r = {B_r} and B_c = {B_c}")
        return configs
    if "(" in key or "{" in key:
        return _sorted_unique(_parse_valid_config(part) for part in key.split(";") if part.strip())
    raise ValueError(
        f"unknown kernel set {key!r}; valid keys are {', '.join(repr(name) for name in named_sets)}, "
        f"'B_r,B_c' (e.g. '128,64'), short forms separated by ';' (e.g. '{SHORT_FORM_EXAMPLE}'), "
        "or a union of those joined by '+' (e.g. 'tune+prog')"
    )


def _parse_valid_config(text: str) -> FlashForwardKernelConfig:
    cfg = parse_kernel_name_into_config(text)
    reason = cfg.validity_error()
    if reason is not None:
        raise ValueError(f"{text.strip()!r} is not a valid configuration: {reason}")
    return cfg


# The small set compiled by default, so a build takes minutes: per dtype and d_head, the tuning
# set's fastest configuration on the H200 (BENCHMARKS.md: d_head 64 and 128 from the sweep over
# every benchmark length, the other head sizes from the sweep at seq 4096); for d_head 192 and 256
# also the causal winners at short and long lengths (d_head 256's short one, (64, 32, 4), is also
# the one whose shared memory fits the 99 KiB of sm_86 and sm_89). Every problem variant is
# compiled for these (variants_to_build); automatic configuration chooses among them (the dispatch
# table).
_DEFAULT_TUNINGS = (
    "32, 128, 64, 4): async+eager+swizzled+load_0_1_2_tiles+buffer+opt_softmax",
    "64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "96, 128, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
    "192, 128, 64, 8): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "192, 64, 32, 4): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "256, 128, 32, 8): async+eager+swizzled+load_0_2_1_tiles+buffer+opt_softmax",
    "256, 128, 64, 8): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
    "256, 64, 32, 4): async+eager+swizzled+load_2_2_1_tiles+buffer+opt_softmax",
)
DEFAULT_BUILD_KERNELS = tuple(f"({dtype.name}, {tuning}" for dtype in DTYPES for tuning in _DEFAULT_TUNINGS)
BUILD_KERNELS_ENV = "FLASH_BUILD_KERNELS"
# What to do about a configuration that is not compiled; the binding's message says it too (the
# generator writes it into the registry).
REBUILD_HINT = (
    f"build a set containing it: {BUILD_KERNELS_ENV}=<default|prog|progall|tune|all|B_r,B_c> "
    "pip install --no-build-isolation -e ."
)
_BUILD_KERNEL_SETS = {
    "default": functools.partial(get_kernel_configs, ";".join(DEFAULT_BUILD_KERNELS)),
    **_NAMED_KERNEL_SETS,
}


def variants_to_build(cfg: FlashForwardKernelConfig) -> tuple[ProblemVariant, ...]:
    """The problem variants compiled for ``cfg``: every variant for the default set's configurations
    (what a plain install serves), the benchmark shapes' for the others (what tuning and the
    progression measure), so large sets stay quick to build."""
    return ALL_VARIANTS if cfg in _default_configs() else BENCHMARK_VARIANTS


@functools.cache
def _default_configs() -> frozenset[FlashForwardKernelConfig]:
    return frozenset(_BUILD_KERNEL_SETS["default"]())


def resolve_build_kernels_key(key: str | None = None) -> str:
    """The build's kernel-set key: ``key``, else ``FLASH_BUILD_KERNELS``, else ``default``."""
    return key if key is not None else os.environ.get(BUILD_KERNELS_ENV) or "default"


def get_kernels_to_build(key: str | None = None) -> list[FlashForwardKernelConfig]:
    """The configurations to compile: ``default`` is ``DEFAULT_BUILD_KERNELS``; any other key is a
    ``get_kernel_configs`` key (``tune``, ``prog``, ``all``, short forms, ...)."""
    return _select_configs(resolve_build_kernels_key(key), _BUILD_KERNEL_SETS)
