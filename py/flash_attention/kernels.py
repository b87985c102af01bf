"""FlashAttention-2 forward pass written from scratch, one compiled kernel per configuration.

    import flash_attention as fa
    cfg = "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles"
    o = fa.forward(cfg, q, k, v)                  # q, k, v: (batch, seq, heads, d_head) CUDA tensors
    o, ms = fa.forward_timed(cfg, q, k, v)

Importing this module touches no GPU.
"""

from __future__ import annotations

import functools

import torch  # noqa: F401  (loads the libraries _C links against: libc10, libtorch)
from flash_helpers.dtypes import DType
from flash_helpers.families import FAMILIES
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.kernel_sets import REBUILD_HINT
from flash_helpers.problem import MaskKind, ProblemVariant
from flash_helpers.sm80_config import FlashForwardKernelConfig

from . import _C

__all__ = [
    "DType",
    "FlashForwardKernelConfig",
    "MaskKind",
    "ProblemVariant",
    "compiled_configs",
    "compiled_kernels",
    "compiled_variants",
    "compiled_kernel_set",
    "forward",
    "forward_timed",
    "kernel_attributes",
]


@functools.cache
def compiled_kernels() -> list[tuple[object, ProblemVariant]]:
    """Every compiled kernel as (configuration, problem variant), each family's in its registry's order."""
    return [
        (FAMILIES[family](*fields), ProblemVariant(MaskKind(mask), masked_tails, score_mods))
        for family, fields, (mask, masked_tails, score_mods) in _C.compiled_kernels()
    ]


@functools.cache
def compiled_configs() -> list:
    """The configurations compiled into this build, each once, in the registries' order."""
    return list(dict.fromkeys(cfg for cfg, _ in compiled_kernels()))


def compiled_variants(cfg) -> list[ProblemVariant]:
    """The problem variants compiled for one configuration (or its short form)."""
    cfg = _as_config(cfg)
    return [variant for compiled, variant in compiled_kernels() if compiled == cfg]


def compiled_kernel_set() -> str:
    """The kernel set (FLASH_BUILD_KERNELS) this build was made with."""
    return _C.compiled_kernel_set()


def _as_config(cfg: FlashForwardKernelConfig | str) -> FlashForwardKernelConfig:
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


@functools.cache
def _compiled_set() -> frozenset:
    return frozenset(compiled_configs())


def forward(
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
):
    """Attention with FlashAttention-2's semantics; returns o, or (o, lse) with return_lse.

    q is (batch, seqlen_q, heads_q, d_head); k and v are (batch, seqlen_k, heads_kv, d_head), with
    heads_q a multiple of heads_kv (query head h reads key/value head h // (heads_q // heads_kv)).
    The lengths are any values >= 1. The masks are aligned to the bottom-right corner of the score
    matrix: with causal, query i attends key j iff j <= i + seqlen_k - seqlen_q; window_size
    (left, right) keeps i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, -1
    meaning unbounded on that side (right is 0 with causal). softmax_scale defaults to
    1/sqrt(d_head); softcap > 0 caps the scaled scores at softcap * tanh(score / softcap);
    alibi_slopes (float32, (heads_q) or (batch, heads_q)) adds -slope * |i + seqlen_k - seqlen_q - j|.
    A query row that attends no key outputs 0, and its lse is +inf. lse is float32,
    (batch, heads_q, seqlen_q), natural log. Runs on the current CUDA stream.
    """
    out, lse, _ = _call(cfg, q, k, v, o, False, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)
    return (out, lse) if return_lse else out


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
):
    """As forward, and also the kernel's run time in milliseconds (CUDA events; synchronizes):
    (o, runtime_ms), or (o, lse, runtime_ms) with return_lse."""
    out, lse, runtime_ms = _call(
        cfg, q, k, v, o, True, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse
    )
    return (out, lse, runtime_ms) if return_lse else (out, runtime_ms)


def _call(cfg, q, k, v, o, benchmark, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse):
    left, right = _window(window_size)
    return _C.forward(
        _as_config(cfg),
        q,
        k,
        v,
        o,
        benchmark,
        causal=causal,
        softmax_scale=softmax_scale,
        window_left=left,
        window_right=right,
        softcap=softcap,
        alibi_slopes=alibi_slopes,
        return_lse=return_lse,
    )


def _window(window_size) -> tuple[int, int]:
    """The (left, right) pair of window_size; the values themselves are checked by the binding."""
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair (left, right) of ints, got {window_size!r}") from None
    return left, right


def kernel_attributes(cfg) -> dict:
    """Registers, spill bytes and shared memory of a compiled kernel (needs a GPU)."""
    return _C.kernel_attributes(_as_config(cfg))
