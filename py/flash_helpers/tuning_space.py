"""The tuning spaces: each family's configuration space (every valid configuration), and which of
them an autotuning sweep tries. Importable without torch.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from flash_helpers import sm80_config, sm90_config
from flash_helpers.dtypes import DTYPES, FP8_DTYPES, DType, coerce_dtype
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = ["get_all_kernel_configs", "get_autotuning_kernel_configs", "should_autotune_config"]

_BOOLS = (False, True)
# Each family's configuration space: its dtypes, its head sizes, then the values of its fields after
# d_head, in field order. The 8-bit inputs are the Hopper family's alone.
_SPACES: dict[type[KernelConfig], tuple[tuple[DType, ...], tuple[int, ...], tuple[tuple, ...]]] = {
    FlashForwardKernelConfig: (
        DTYPES,
        sm80_config.D_HEADS,
        (
            sm80_config.B_RS,
            sm80_config.B_CS,
            sm80_config.N_WARPS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            sm80_config.LOAD_TILES,
            sm80_config.LOAD_TILES,
            sm80_config.LOAD_TILES,
            _BOOLS,
            _BOOLS,
        ),
    ),
    HopperForwardKernelConfig: (
        DTYPES + FP8_DTYPES,
        sm90_config.D_HEADS,
        (
            sm90_config.B_RS,
            sm90_config.B_CS,
            sm90_config.STAGES,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
            _BOOLS,
        ),
    ),
}


@functools.cache
def _valid_configs(
    cls: type[KernelConfig], dtypes: tuple[DType, ...], d_heads: tuple[int, ...]
) -> tuple[KernelConfig, ...]:
    """Every valid configuration of one family with these dtypes and head sizes (the product is
    large: cached)."""
    product = itertools.product(dtypes, d_heads, *_SPACES[cls][2])
    return tuple(sorted({cfg for cfg in itertools.starmap(cls, product) if cfg.is_valid()}))


def _every_family(dtypes: Iterable[DType] | None, d_heads: Iterable[int] | None) -> list[KernelConfig]:
    """The valid configurations of every family with these dtypes and head sizes (None: each
    family's own), sorted: each family's in turn, in the order of their names."""
    dtypes = None if dtypes is None else tuple(coerce_dtype(dtype) for dtype in dtypes)
    d_heads = None if d_heads is None else tuple(d_heads)
    return [
        cfg
        for cls in sorted(_SPACES, key=lambda cls: cls.family)
        for cfg in _valid_configs(
            cls, _SPACES[cls][0] if dtypes is None else dtypes, _SPACES[cls][1] if d_heads is None else d_heads
        )
    ]


def get_all_kernel_configs() -> list[KernelConfig]:
    """Every valid configuration of every family, over each family's whole configuration space (the
    Hopper family's e4m3 configurations too)."""
    return _every_family(None, None)


def should_autotune_config(cfg: KernelConfig) -> bool:
    """Whether an autotuning sweep should try ``cfg``: it is valid, of a 16-bit dtype (the e4m3
    configurations are not swept yet: automatic configuration takes them by rule), and its family's
    sweep tries it."""
    return cfg.is_valid() and cfg.dtype in DTYPES and _AUTOTUNED[type(cfg)](cfg)


def _sm80_autotuned(cfg: FlashForwardKernelConfig) -> bool:
    """The SM80 family's sweep varies what trades off against the register budget and the block
    shape: B_r, B_c, n_warps, whether Q stays in registers, and the K and V chunk sizes. The knobs
    that only remove work are always on (the progression measures each of them on its own): async
    copies, eager K/V loads, the swizzled layout, double-buffered fragment loads and the optimized
    softmax. K and V are always loaded in chunks of 1 or 2 k-slices: whole operands need more
    registers than a thread has for any block shape worth tuning. Blocks whose warps split the keys
    (fewer than 16 rows per warp) are decoding's, which takes its configuration by rule, not from
    the dispatch table this sweep ranks.
    """
    return (
        cfg.key_groups == 1
        and cfg.async_copy
        and cfg.eager_load_blocks
        and cfg.swizzled
        and cfg.mma_double_buffer_loads
        and cfg.optimized_softmax
        and cfg.K_mma_load_K_tiles in (1, 2)
        and cfg.V_mma_load_K_tiles in (1, 2)
    )


# The Hopper family's sweep: block shapes of two or three consumer warpgroups, two pipeline stages.
_SM90_TUNING_B_RS = (128, 192)
_SM90_TUNING_STAGES = (2,)
_SM90_MULTICAST_D_HEADS = (64, 128)


def _sm90_autotuned(cfg: HopperForwardKernelConfig) -> bool:
    """The Hopper family's sweep varies the block shape (B_r of 128 or 192, every B_c) at two
    pipeline stages, with the knobs that overlap work on: warp specialization, the intra-warpgroup
    overlap, and ping-pong scheduling wherever there are two consumer warpgroups to take turns; with
    and without a persistent block, and with and without Q in registers (shared-memory reads saved
    for registers taken from the rest of the softmax: where they are short, it is slower). Multicast
    is tried on the persistent 128-row blocks of the two head sizes most models use, 64 and 128
    (each further configuration adds to the tuning build's time); deferred_O_rescale is not tried
    (it would double the sweep; its blocks are measured against their twins, which give the same
    bits)."""
    return (
        not cfg.deferred_O_rescale
        and cfg.B_r in _SM90_TUNING_B_RS
        and cfg.stages in _SM90_TUNING_STAGES
        and cfg.warp_specialized
        and cfg.intra_wg_overlap
        and cfg.pingpong == (cfg.B_r >= 128)
        and (not cfg.multicast or (cfg.persistent and cfg.B_r == 128 and cfg.d_head in _SM90_MULTICAST_D_HEADS))
    )


_AUTOTUNED = {FlashForwardKernelConfig: _sm80_autotuned, HopperForwardKernelConfig: _sm90_autotuned}


def get_autotuning_kernel_configs(
    dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] | None = None
) -> list[KernelConfig]:
    """The autotuning space of every family: valid configurations that pass
    ``should_autotune_config``, with these dtypes and head sizes (default: each family's)."""
    return [cfg for cfg in _every_family(dtypes, d_heads) if should_autotune_config(cfg)]
