"""The kernel engineer's API: an explicit configuration per call, and what the build compiled.

    cfg = "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles"
    compiled_configs()                          # what this build has
    o, ms = forward_timed(cfg, q, k, v)         # q, k, v: (batch, seq, heads, d_head) CUDA tensors
"""

from __future__ import annotations

import functools

import torch  # noqa: F401  (loads the libraries _C links against: libc10, libtorch)
from flash_helpers.build_env import REBUILD_HINT
from flash_helpers.families import FAMILIES
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import MaskKind, ProblemVariant
from flash_helpers.sm80_config import FlashForwardKernelConfig

from . import _C
from .sequences import sequence_arguments

__all__ = [
    "as_config",
    "cached_config",
    "compiled_configs",
    "compiled_kernels",
    "compiled_variants",
    "compiled_kernel_set",
    "forward_timed",
    "kernel_attributes",
]


@functools.cache
def compiled_kernels() -> list[tuple[object, ProblemVariant]]:
    """Every compiled kernel as (configuration, problem variant), each family's in its registry's order."""
    return [
        (FAMILIES[family](*fields), ProblemVariant(MaskKind(mask), *flags))
        for family, fields, (mask, *flags) in _C.compiled_kernels()
    ]


@functools.cache
def compiled_configs() -> list:
    """The configurations compiled into this build, each once, in the registries' order."""
    return list(dict.fromkeys(cfg for cfg, _ in compiled_kernels()))


def compiled_variants(cfg) -> list[ProblemVariant]:
    """The problem variants compiled for one configuration (or its short form)."""
    cfg = as_config(cfg)
    return [variant for compiled, variant in compiled_kernels() if compiled == cfg]


def compiled_kernel_set() -> str:
    """The kernel set (FLASH_BUILD_KERNELS) this build was made with."""
    return _C.compiled_kernel_set()


def as_config(cfg: FlashForwardKernelConfig | str) -> FlashForwardKernelConfig:
    """Accepts a config or its short form, and rejects invalid or uncompiled ones with the reason."""
    if isinstance(cfg, str):
        cfg = parse_kernel_name_into_config(cfg)
    if not isinstance(cfg, tuple(FAMILIES.values())):
        raise TypeError(f"kernel_cfg: expected a kernel configuration or its short form, got {type(cfg).__name__}")
    reason = cfg.validity_error()
    if reason is not None:
        raise ValueError(f"kernel_cfg: {cfg.short_form()} is not a valid configuration: {reason}")
    if cfg not in _compiled_set():
        raise ValueError(
            f"kernel_cfg: {cfg.short_form()} is not compiled into this build (kernel set "
            f"'{compiled_kernel_set()}'); {REBUILD_HINT}"
        )
    return cfg


# Parsing and checking a configuration costs more than a small problem's kernel: each is done once.
# Only for configurations and strings (hashable); as_config names any other type.
cached_config = functools.lru_cache(maxsize=256)(as_config)


@functools.cache
def _compiled_set() -> frozenset:
    return frozenset(compiled_configs())


def forward_timed(
    cfg,
    q,
    k,
    v,
    o=None,
    *,
    causal=False,
    softmax_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    return_lse=False,
    num_splits=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
    **sequences,
):
    """As flash_attention.forward, calling the extension directly, and also the kernels' run time in
    milliseconds (CUDA events, split and combine together; synchronizes): (o, runtime_ms), or (o,
    lse, runtime_ms) with return_lse. ``sequences`` are forward's per-sequence keywords
    (cu_seqlens_q, ..., block_table); the descales and out_dtype are forward's FP8 ones."""
    out, lse, runtime_ms = _C.forward(
        as_config(cfg), q, k, v, o, True, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, False,
        **sequence_arguments(**sequences), num_splits=num_splits, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale, out_dtype=out_dtype,
    )
    return (out, lse, runtime_ms) if return_lse else (out, runtime_ms)


def kernel_attributes(cfg, variant: ProblemVariant | None = None) -> dict:
    """Registers, spill bytes and shared memory of one compiled kernel of a configuration (or its
    short form): its kernel for ``variant``, one of ``compiled_variants(cfg)``, or without one the
    first of them (needs a GPU). A configuration's variants differ in registers, and an FP8 cache's
    (``kv_e4m3``) in shared memory too. ``producer_registers`` and ``consumer_registers`` are the
    registers per thread setmaxnreg leaves the Hopper family's producer warpgroup and gives each
    consumer warpgroup (0 where the kernel moves none, and every thread keeps ``registers``)."""
    cfg = as_config(cfg)
    if variant is None:
        return _C.kernel_attributes(cfg)
    if not isinstance(variant, ProblemVariant):
        raise TypeError(f"variant: expected a ProblemVariant or None, got {type(variant).__name__}")
    compiled = compiled_variants(cfg)
    if variant not in compiled:
        raise ValueError(
            f"variant: {variant.describe()} is not compiled for {cfg.short_form()}; compiled_variants(cfg) lists "
            f"{len(compiled)}: {'; '.join(v.describe() for v in compiled)}"
        )
    return _C.kernel_attributes(cfg, (int(variant.mask), *variant.flags()))
