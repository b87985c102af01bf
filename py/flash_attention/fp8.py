"""FP8 (e4m3) inputs' arguments, FlashAttention-3's: the dequantisation factors q_descale,
k_descale and v_descale (float32, (batch, heads_kv); None stands for factors of 1) and the output's
dtype, out_dtype (torch.bfloat16 by default, or torch.float16). Gathered as the extension and the
torch operators take them, as keywords, only those given (a 16-bit call passes none of them on); and
the output's dtype as the binding decides it, for the operators' fake kernels.
"""

from __future__ import annotations

import torch
from flash_helpers.dtypes import DType, output_dtype

__all__ = ["DESCALES", "fp8_arguments", "output_torch_dtype"]

# The descales' names, in the operators' order (out_dtype follows them).
DESCALES = ("q_descale", "k_descale", "v_descale")


def fp8_arguments(*, q_descale=None, k_descale=None, v_descale=None, out_dtype=None) -> dict | None:
    """The FP8 arguments that were given (not None), by name; None where none was (one chain of
    identity tests: what a 16-bit call pays for them). Their types and values are checked where they
    are used (the binding, binding/fp8.h)."""
    if q_descale is k_descale is v_descale is out_dtype is None:
        return None
    given = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale, "out_dtype": out_dtype}
    return {name: value for name, value in given.items() if value is not None}


def output_torch_dtype(q_dtype: torch.dtype, out_dtype: torch.dtype | None = None) -> torch.dtype:
    """The dtype of o for q of ``q_dtype`` (flash_helpers.dtypes.output_dtype's rule): q's for
    16-bit inputs, out_dtype's (bfloat16 by default) for float8_e4m3fn ones. A q of a type no kernel
    takes keeps its own: the call names it."""
    try:
        dtype = DType.from_torch_dtype(q_dtype)
    except ValueError:
        return q_dtype
    if out_dtype is None:
        return output_dtype(dtype).to_torch_dtype()
    try:
        asked = DType.from_torch_dtype(out_dtype)
    except (TypeError, ValueError):
        raise ValueError(f"out_dtype: must be torch.float16 or torch.bfloat16, got {out_dtype!r}") from None
    return output_dtype(dtype, asked).to_torch_dtype()
