"""FlashAttention-2 forward pass written from scratch, one compiled kernel per configuration.

For models (the configuration is chosen per call from a tuned table):

    from flash_attention import flash_attn_func, flash_attn_varlen_func, scaled_dot_product_attention
    o = flash_attn_func(q, k, v, causal=True)     # (batch, seq, heads, d), as FlashAttention-2
    o = flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               causal=True)       # (total, heads, d): sequences of their own lengths
    o = scaled_dot_product_attention(query, key, value, is_causal=True)   # (batch, heads, seq, d)
    o = flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=lengths,
                                causal=True)       # decoding: appends to the cache, then attends it

For kernel engineers (an explicit configuration):

    import flash_attention as fa
    cfg = "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles"
    o = fa.forward(cfg, q, k, v)
    o, ms = fa.forward_timed(cfg, q, k, v)

Importing this module touches no GPU. `python -m flash_attention` describes the build.
"""

from __future__ import annotations

import importlib.util

# Every submodule below needs the compiled extension; without it their imports fail in a way that
# says nothing of the cause (a "circular import"), so say it here.
if importlib.util.find_spec(f"{__name__}._C") is None:
    raise ImportError(
        f"{__name__}._C, the compiled extension, is not built: run `bash tools/test.sh` (builds, then tests) "
        "or `pip install --no-build-isolation -e .` in the repository root; the first build takes minutes"
    )

from flash_helpers.dtypes import DType
from flash_helpers.problem import MaskKind, ProblemVariant
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

from . import ops  # noqa: F401  (registers torch.ops.flash_attention)
from .dispatch import ConfigChoice, choose_config
from .functional import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    forward,
    scaled_dot_product_attention,
)
from .kvcache import flash_attn_with_kvcache
from .kernels import (
    compiled_configs,
    compiled_kernel_set,
    compiled_kernels,
    compiled_variants,
    forward_timed,
    kernel_attributes,
)
from .version import __version__

__all__ = [
    "ConfigChoice",
    "DType",
    "FlashForwardKernelConfig",
    "HopperForwardKernelConfig",
    "MaskKind",
    "ProblemVariant",
    "__version__",
    "choose_config",
    "compiled_configs",
    "compiled_kernel_set",
    "compiled_kernels",
    "compiled_variants",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
    "forward",
    "forward_timed",
    "kernel_attributes",
    "scaled_dot_product_attention",
]
