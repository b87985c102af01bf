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
from flash_helpers.sm80_config import FlashForwardKernelConfig

from . import _C

__all__ = [
    "DType",
    "FlashForwardKernelConfig",
    "compiled_configs",
    "compiled_kernel_set",
    "forward",
    "forward_timed",
    "kernel_attributes",
]


@functools.cache
def compiled_configs() -> list:
    """The configurations compiled into this build, each family's in its registry's order."""
    return [FAMILIES[family](*fields) for family, fields in _C.compiled_configs()]


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


def forward(cfg, q, k, v, o=None):
    """softmax(q k^T / sqrt(d_head)) v for (batch, seq, heads, d_head) tensors; returns o.

    q, k, v (and o, if given) must share device, dtype (cfg.dtype) and shape; only the last
    dimension must be contiguous. seq must be a multiple of cfg.B_r and cfg.B_c. Runs on the
    current CUDA stream.
    """
    out, _ = _C.forward(_as_config(cfg), q, k, v, o, False)
    return out


def forward_timed(cfg, q, k, v, o=None):
    """As forward, and also the kernel's run time in milliseconds (CUDA events; synchronizes)."""
    return _C.forward(_as_config(cfg), q, k, v, o, True)


def kernel_attributes(cfg) -> dict:
    """Registers, spill bytes and shared memory of a compiled kernel (needs a GPU)."""
    return _C.kernel_attributes(_as_config(cfg))
