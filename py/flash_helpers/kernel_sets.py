"""Named sets of configurations, spanning the kernel families: what the build compiles
(``FLASH_BUILD_KERNELS``, for the architectures of ``TORCH_CUDA_ARCH_LIST``) and what the tests and
tools run (``KERNELS``). Importable without torch.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from collections.abc import Callable, Iterable

from flash_helpers import sm90_config
from flash_helpers.dtypes import DTYPES, DType, coerce_dtype
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import (
    ALL_VARIANTS,
    BENCHMARK_LENGTH_UNIT,
    BENCHMARK_TAIL_VARIANTS,
    BENCHMARK_VARIANTS,
    ProblemVariant,
)
from flash_helpers.sm80_config import B_CS, B_RS, D_HEADS, LOAD_TILES, N_WARPS, SHORT_FORM_EXAMPLE, FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = [
    "ARCH_LIST_ENV",
    "BUILD_KERNELS_ENV",
    "DEFAULT_ARCH_LIST",
    "DEFAULT_BUILD_KERNELS",
    "HOPPER_PROGRESSION_BLOCK",
    "HOPPER_PROGRESSION_STEPS",
    "KERNELS_ENV",
    "PROGRESSION_BLOCK_SIZE",
    "PROGRESSION_STEPS",
    "REBUILD_HINT",
    "arch_list_for_build",
    "get_all_kernel_configs",
    "get_autotuning_kernel_configs",
    "get_kernel_configs",
    "get_kernel_progression_configs",
    "get_kernels_to_build",
    "get_progression_steps",
    "hopper_in_arch_list",
    "resolve_arch_list",
    "resolve_build_kernels_key",
    "should_autotune_config",
    "variants_to_build",
]

_BOOLS = (False, True)
# Each family's configuration space: its head sizes, then the values of its fields after d_head, in
# field order.
_SPACES: dict[type[KernelConfig], tuple[tuple[int, ...], tuple[tuple, ...]]] = {
    FlashForwardKernelConfig: (
        D_HEADS,
        (B_RS, B_CS, N_WARPS, _BOOLS, _BOOLS, _BOOLS, LOAD_TILES, LOAD_TILES, LOAD_TILES, _BOOLS, _BOOLS),
    ),
    HopperForwardKernelConfig: (
        sm90_config.D_HEADS,
        (sm90_config.B_RS, sm90_config.B_CS, sm90_config.STAGES, _BOOLS, _BOOLS, _BOOLS, _BOOLS, _BOOLS, _BOOLS),
    ),
}


def _sorted_unique(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    return sorted(set(configs))


@functools.cache
def _valid_configs(
    cls: type[KernelConfig], dtypes: tuple[DType, ...], d_heads: tuple[int, ...]
) -> tuple[KernelConfig, ...]:
    """Every valid configuration of one family with these dtypes and head sizes (the product is
    large: cached)."""
    product = itertools.product(dtypes, d_heads, *_SPACES[cls][1])
    return tuple(_sorted_unique(cfg for cfg in itertools.starmap(cls, product) if cfg.is_valid()))


def _every_family(dtypes: Iterable[DType], d_heads: Iterable[int] | None) -> list[KernelConfig]:
    """The valid configurations of every family with these dtypes and head sizes (None: each
    family's own), sorted: each family's in turn, in the order of their names."""
    dtypes = tuple(coerce_dtype(dtype) for dtype in dtypes)
    d_heads = None if d_heads is None else tuple(d_heads)
    return [
        cfg
        for cls in sorted(_SPACES, key=lambda cls: cls.family)
        for cfg in _valid_configs(cls, dtypes, _SPACES[cls][0] if d_heads is None else d_heads)
    ]


def get_all_kernel_configs() -> list[KernelConfig]:
    """Every valid configuration of every family, over each family's whole configuration space."""
    return _every_family(DTYPES, None)


def should_autotune_config(cfg: KernelConfig) -> bool:
    """Whether an autotuning sweep should try ``cfg``: it is valid, and its family's sweep tries it."""
    return cfg.is_valid() and _AUTOTUNED[type(cfg)](cfg)


def _sm80_autotuned(cfg: FlashForwardKernelConfig) -> bool:
    """The SM80 family's sweep varies what trades off against the register budget and the block
    shape: B_r, B_c, n_warps, whether Q stays in registers, and the K and V chunk sizes. The knobs
    that only remove work are always on (the progression measures each of them on its own): async
    copies, eager K/V loads, the swizzled layout, double-buffered fragment loads and the optimized
    softmax. K and V are always loaded in chunks of 1 or 2 k-slices: whole operands need more
    registers than a thread has for any block shape worth tuning.
    """
    return (
        cfg.async_copy
        and cfg.eager_load_blocks
        and cfg.swizzled
        and cfg.mma_double_buffer_loads
        and cfg.optimized_softmax
        and cfg.K_mma_load_K_tiles in (1, 2)
        and cfg.V_mma_load_K_tiles in (1, 2)
    )


# The Hopper family's sweep: block shapes of two or three consumer warpgroups, two pipeline stages.
_HOPPER_TUNING_B_RS = (128, 192)
_HOPPER_TUNING_STAGES = (2,)
_HOPPER_MULTICAST_D_HEADS = (64, 128)


def _hopper_autotuned(cfg: HopperForwardKernelConfig) -> bool:
    """The Hopper family's sweep varies the block shape (B_r of 128 or 192, every B_c) at two
    pipeline stages, with the knobs that overlap work on: warp specialization, the intra-warpgroup
    overlap, and ping-pong scheduling wherever there are two consumer warpgroups to take turns; with
    and without a persistent block, and with and without Q in registers (shared-memory reads saved
    for registers taken from the rest of the softmax: where they are short, it is slower). Multicast
    is tried on the persistent 128-row blocks of the two head sizes most models use, 64 and 128
    (each further configuration adds to the tuning build's time)."""
    return (
        cfg.B_r in _HOPPER_TUNING_B_RS
        and cfg.stages in _HOPPER_TUNING_STAGES
        and cfg.warp_specialized
        and cfg.intra_wg_overlap
        and cfg.pingpong == (cfg.B_r >= 128)
        and (not cfg.multicast or (cfg.persistent and cfg.B_r == 128 and cfg.d_head in _HOPPER_MULTICAST_D_HEADS))
    )


_AUTOTUNED = {FlashForwardKernelConfig: _sm80_autotuned, HopperForwardKernelConfig: _hopper_autotuned}


def get_autotuning_kernel_configs(
    dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] | None = None
) -> list[KernelConfig]:
    """The autotuning space of every family: valid configurations that pass
    ``should_autotune_config``, with these dtypes and head sizes (default: each family's)."""
    return [cfg for cfg in _every_family(dtypes, d_heads) if should_autotune_config(cfg)]


# The SM80 kernel's optimisation history: each step adds knobs to the previous one, in the order they
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
# The Hopper kernel's steps, in the same way: TMA and wgmma with the consumers issuing their own
# loads, then a producer warpgroup, then ping-pong scheduling of the consumers, then the overlap of
# softmax and P V inside a warpgroup, then persistent blocks, then Q held in registers.
HOPPER_PROGRESSION_STEPS = [
    ("hopper_base", ""),
    ("hopper_ws", "ws"),
    ("hopper_pingpong", "ws+pingpong"),
    ("hopper_overlap", "ws+pingpong+overlap"),
    ("hopper_persistent", "ws+pingpong+overlap+persistent"),
    ("hopper_qregs", "ws+pingpong+overlap+persistent+qregs"),
]
# (B_r, B_c, stages) at which the Hopper progression is compared by default; every block size of the
# progression has its number of stages.
HOPPER_PROGRESSION_BLOCK = (128, 128, 2)
# Per family: its steps, the block at which they are compared, and every block size.
_PROGRESSIONS = {
    FlashForwardKernelConfig: (
        PROGRESSION_STEPS,
        PROGRESSION_BLOCK_SIZE,
        tuple(itertools.product(B_RS, B_CS, N_WARPS)),
    ),
    HopperForwardKernelConfig: (
        HOPPER_PROGRESSION_STEPS,
        HOPPER_PROGRESSION_BLOCK,
        tuple(
            (B_r, B_c, HOPPER_PROGRESSION_BLOCK[2])
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
        progression.append((name, _sorted_unique(cfg for cfg in configs if cfg.is_valid())))
    return progression


def get_kernel_progression_configs(
    all_block_sizes: bool = False, dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = (128,)
) -> list[KernelConfig]:
    """Every family's valid progression steps at its progression block, or at every block size."""
    dtypes, d_heads = tuple(dtypes), tuple(d_heads)
    return _sorted_unique(
        cfg
        for cls in _PROGRESSIONS
        for _, configs in get_progression_steps(cls, all_block_sizes, dtypes, d_heads)
        for cfg in configs
    )


KERNELS_ENV = "KERNELS"
_NAMED_KERNEL_SETS: dict[str, Callable[[], list[KernelConfig]]] = {
    # What a plain install compiles (DEFAULT_BUILD_KERNELS, below).
    "default": lambda: get_kernel_configs(";".join(DEFAULT_BUILD_KERNELS)),
    "all": get_all_kernel_configs,
    "prog": get_kernel_progression_configs,
    "progall": functools.partial(get_kernel_progression_configs, all_block_sizes=True),
    "tune": get_autotuning_kernel_configs,
}
_BLOCK_SIZES_KEY_RE = re.compile(r"(\d+)\s*,\s*(\d+)")


def get_kernel_configs(key: str | None = None) -> list[KernelConfig]:
    """The configurations a tool or test run should use, selected by ``key``.

    ``key`` defaults to the ``KERNELS`` environment variable, then to ``all``. It is a set name
    (``default``, ``all``, ``prog``, ``progall``, ``tune``; each holds every family's configurations), ``B_r,B_c``
    (the SM80 family's tuning set at those block sizes), or short forms of any family separated by
    ``;`` (each must be a valid configuration).
    """
    if key is None:
        key = os.environ.get(KERNELS_ENV) or "all"
    return _select_configs(key, _NAMED_KERNEL_SETS)


def _select_configs(
    key: str, named_sets: dict[str, Callable[[], list[KernelConfig]]], arch_list: str | None = None
) -> list[KernelConfig]:
    """The configurations ``key`` selects; for a build for ``arch_list`` (None: no build), without
    Hopper configurations unless the list has sm_90: sets leave them out, and naming one is an error."""
    key = key.strip()
    with_hopper = arch_list is None or hopper_in_arch_list(arch_list)
    if "+" in key and "(" not in key and "{" not in key:
        # A union of sets, e.g. "tune+prog" (short forms contain "+" too, but also "(").
        return _sorted_unique(cfg for part in key.split("+") for cfg in _select_configs(part, named_sets, arch_list))
    if key.lower() in named_sets:
        configs = named_sets[key.lower()]()
        return configs if with_hopper else [cfg for cfg in configs if not isinstance(cfg, HopperForwardKernelConfig)]
    block_sizes = _BLOCK_SIZES_KEY_RE.fullmatch(key)
    if block_sizes:
        B_r, B_c = map(int, block_sizes.groups())
        configs = [
            cfg
            for cfg in get_autotuning_kernel_configs()
            if isinstance(cfg, FlashForwardKernelConfig) and (cfg.B_r, cfg.B_c) == (B_r, B_c)
        ]
        if not configs:
            raise ValueError(f"kernel set {key!r}: no SM80 tuning configuration has B_r = {B_r} and B_c = {B_c}")
        return configs
    if "(" in key or "{" in key:
        configs = _sorted_unique(_parse_valid_config(part) for part in key.split(";") if part.strip())
        hopper = [cfg.short_form() for cfg in configs if isinstance(cfg, HopperForwardKernelConfig)]
        if hopper and not with_hopper:
            raise ValueError(
                f"kernel set {key!r} names {len(hopper)} Hopper configuration(s) ({'; '.join(hopper)}), which need "
                f"sm_90a machine code, but {ARCH_LIST_ENV}={arch_list!r} has no 9.0: add 9.0 to {ARCH_LIST_ENV}"
            )
        return configs
    raise ValueError(
        f"unknown kernel set {key!r}; valid keys are {', '.join(repr(name) for name in named_sets)}, "
        f"'B_r,B_c' (e.g. '128,64'), short forms separated by ';' (e.g. '{SHORT_FORM_EXAMPLE}' or "
        f"'{sm90_config.SHORT_FORM_EXAMPLE}'), or a union of those joined by '+' (e.g. 'tune+prog')"
    )


def _parse_valid_config(text: str) -> KernelConfig:
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
# The Hopper family's configurations of the default build (where 9.0 is built): per dtype and
# d_head, the fastest of an H200 sweep of block shapes at the benchmark lengths (BENCHMARKS.md);
# for d_head 64 and 128 also the persistent variant, faster at short lengths without a mask, and for
# d_head 64 a persistent block of two consumer warpgroups, faster at short lengths with a causal
# mask (a 128-row work tile wastes fewer rows on the diagonal than a 192-row one); for d_head 96
# the sweep's winners without a mask (B_c 176) and with the causal mask (B_c 128); for d_head 128
# persistent blocks of 144 and 160 keys, which leave less of their last tile empty than 128 keys
# at many lengths that are not multiples of 128 (1000 keys: 1008 in 144-key tiles against 1024;
# 4000 and 8000: whole 160-key tiles). Q is in registers where that measured faster with and
# without the causal mask (d_head 64 and 96 at 128 keys, d_head 128's non-persistent block); d_head
# 32's and 128's persistent blocks come both ways, Q in registers being faster without a mask and
# slower with the causal one, whose masking code is then short of registers (three consumer
# warpgroups have 160 each at d_head 32). The dispatch table picks among them per shape, scaling its
# measured times by the tiles each configuration visits at the problem's lengths.
_DEFAULT_HOPPER_TUNINGS = (
    "32, 192, 128, 2): ws+pingpong+overlap+persistent",
    "32, 192, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "64, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "64, 192, 128, 2): ws+pingpong+overlap",
    "64, 192, 128, 2): ws+pingpong+overlap+persistent",
    "96, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "96, 128, 176, 2): ws+pingpong+overlap+persistent",
    "128, 128, 128, 2): ws+pingpong+overlap+qregs",
    "128, 128, 128, 2): ws+pingpong+overlap+persistent",
    "128, 128, 128, 2): ws+pingpong+overlap+persistent+qregs",
    "128, 128, 144, 2): ws+pingpong+overlap+persistent",
    "128, 128, 160, 2): ws+pingpong+overlap+persistent",
    "192, 128, 112, 2): ws+pingpong+overlap",
    "256, 128, 64, 2): ws+pingpong+overlap",
)
DEFAULT_BUILD_KERNELS = tuple(
    f"{prefix}({dtype.name}, {tuning}"
    for prefix, tunings in (("", _DEFAULT_TUNINGS), (HopperForwardKernelConfig.family, _DEFAULT_HOPPER_TUNINGS))
    for dtype in DTYPES
    for tuning in tunings
)
BUILD_KERNELS_ENV = "FLASH_BUILD_KERNELS"
ARCH_LIST_ENV = "TORCH_CUDA_ARCH_LIST"
# The architectures a build compiles for unless TORCH_CUDA_ARCH_LIST says otherwise: sm_80 and sm_90.
DEFAULT_ARCH_LIST = "8.0;9.0"
# What to do about a configuration that is not compiled; the binding's message says it too (the
# generator writes it into the registry).
REBUILD_HINT = (
    f"build a set containing it: {BUILD_KERNELS_ENV}=<default|prog|progall|tune|all|B_r,B_c> "
    f"pip install --no-build-isolation -e . (Hopper configurations also need 9.0 in {ARCH_LIST_ENV})"
)
def variants_to_build(cfg: KernelConfig) -> tuple[ProblemVariant, ...]:
    """The problem variants compiled for ``cfg``: every variant for the default set's configurations
    (what a plain install serves), the benchmark shapes' for the others (what tuning and the
    progression measure), so large sets stay quick to build; with their masked-tail versions where
    the configuration's blocks do not divide the benchmark lengths (B_r 192, B_c 176, ...)."""
    if cfg in _default_configs():
        return ALL_VARIANTS
    if cfg.needs_masked_tails(BENCHMARK_LENGTH_UNIT, BENCHMARK_LENGTH_UNIT):
        return BENCHMARK_VARIANTS + BENCHMARK_TAIL_VARIANTS
    return BENCHMARK_VARIANTS


@functools.cache
def _default_configs() -> frozenset[KernelConfig]:
    """The default set of every family, whatever the architectures."""
    return frozenset(_NAMED_KERNEL_SETS["default"]())


def resolve_build_kernels_key(key: str | None = None) -> str:
    """The build's kernel-set key: ``key``, else ``FLASH_BUILD_KERNELS``, else ``default``."""
    return key if key is not None else os.environ.get(BUILD_KERNELS_ENV) or "default"


def resolve_arch_list(arch_list: str | None = None) -> str:
    """The build's architectures: ``arch_list``, else ``TORCH_CUDA_ARCH_LIST``, else ``DEFAULT_ARCH_LIST``."""
    return arch_list if arch_list is not None else os.environ.get(ARCH_LIST_ENV) or DEFAULT_ARCH_LIST


# A 9.0 entry of an architecture list as torch's extension builder reads TORCH_CUDA_ARCH_LIST
# (entries separated by ';' or spaces, each optionally suffixed with +PTX), plain or as 9.0a.
_SM90_ENTRY_RE = re.compile(r"(?<![^;\s])9\.0a?(?=\+PTX|[;\s]|$)")


def hopper_in_arch_list(arch_list: str) -> bool:
    """Whether a build for these architectures compiles the Hopper family: it needs an sm_90 entry
    (9.0 or 9.0a, with or without +PTX)."""
    return _SM90_ENTRY_RE.search(arch_list) is not None


def arch_list_for_build(arch_list: str) -> str:
    """The architecture list to give torch's extension builder: 9.0 becomes 9.0a, the sm_90a machine
    code that the Hopper family's wgmma and setmaxnreg need (it runs on sm_90 alone; the SM80
    family's kernels compile the same for it). The other entries, suffixes and separators stay."""
    return _SM90_ENTRY_RE.sub("9.0a", arch_list)


def get_kernels_to_build(key: str | None = None, arch_list: str | None = None) -> list[KernelConfig]:
    """The configurations to compile for ``arch_list`` (``resolve_arch_list``): ``default`` is
    ``DEFAULT_BUILD_KERNELS``; any other key is a ``get_kernel_configs`` key (``tune``, ``prog``,
    ``all``, short forms, ...).

    Hopper configurations are compiled only for a list with 9.0: without it the sets leave them out,
    so a build for sm_80 alone keeps working, and short forms naming one raise ValueError.
    """
    return _select_configs(resolve_build_kernels_key(key), _NAMED_KERNEL_SETS, resolve_arch_list(arch_list))
