"""The attention forward as PyTorch operators, so torch.compile traces it without a graph break (the
extension registers them with the dispatcher, and their kernels are C++; here are their fake
implementations, for tracing, and the plain call that skips them):

    torch.ops.flash_attention.forward(q, k, v, config, causal, softmax_scale, window_size, softcap,
                                      alibi_slopes, return_lse, cu_seqlens_q=None, cu_seqlens_k=None,
                                      max_seqlen_q=None, max_seqlen_k=None, seqused_q=None,
                                      seqused_k=None, leftpad_q=None, leftpad_k=None,
                                      kv_batch_idx=None, block_table=None, num_splits=None,
                                      q_descale=None, k_descale=None, v_descale=None,
                                      out_dtype=None) -> (o, lse)
    torch.ops.flash_attention.forward_out(...the ten before the per-sequence ones..., o,
                                          ...the ten per-sequence ones, num_splits, the four
                                          FP8 ones...) -> lse  (writes o in place)
    torch.ops.flash_attention.append_to_cache(q, k_cache, v_cache, k, v, cache_seqlens,
                                              cache_batch_idx, block_table, rotary_cos, rotary_sin,
                                              rotary_interleaved, q_per_token, k_descale=None,
                                              v_descale=None) -> q rotated
                                              (writes k_cache and v_cache in place)

``config`` is a configuration's short form, or "" to let the automatic choice (``choose_config``'s)
pick one when the call runs. ``window_size`` is the pair (left, right). Without ``return_lse``,
``lse`` is an empty float32 tensor (an operator's outputs cannot be optional). The ten optional
per-sequence arguments are flash_attention.forward's: with cu_seqlens_q, q is (total_q, heads_q,
d_head) and lse (heads_q, total_q); otherwise lse is (batch, heads_q, seqlen_q). ``num_splits`` is
forward's (None: the heuristic's count with "", 1 with a configuration). The schema types them:
``Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, ScalarType?
out_dtype=None``, float8_e4m3fn inputs' dequantisation factors and output dtype
(flash_attention.fp8); o is then out_dtype's (bfloat16 by default).

append_to_cache is flash_attn_with_kvcache's first step (flash_attention.kvcache): k and v
appended to the caches at cache_seqlens, k and q rotated where rotary_cos is given; without it the
result is an empty tensor. float8_e4m3fn caches store k and v quantised by k_descale and v_descale
(float32, (batch, heads_kv)); q stays 16-bit.

There is no backward pass yet. Calling forward with an input that requires grad (q, k, v,
alibi_slopes or a descale) while grad mode is on raises, rather than return an output detached from
the graph; so do calls that skip the operators (check_no_grad).
"""

import torch
from torch import Tensor

from . import _C
from .dispatch import load_dispatch_tables
from .fp8 import output_torch_dtype

__all__ = ["MISSING_BACKWARD", "check_no_grad", "launch"]

MISSING_BACKWARD = _C.MISSING_BACKWARD


def launch(
    cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first=False,
    sequences=None, num_splits=None, fp8=None,
):
    """The extension's forward with a checked configuration (kernels.cached_config's), or None for
    the automatic choice: (o, lse or None). ``sequences``: the per-sequence arguments that were given
    (cu_seqlens_q, ..., block_table, by name), passed on as keywords; None for a dense call, which
    passes none. num_splits: None for the extension's default. ``fp8``: the FP8 arguments given
    (fp8.fp8_arguments), None for none. The extension checks every other argument. It checks no
    grad: callers outside the operators do (check_no_grad)."""
    if cfg is None:
        load_dispatch_tables()
    args = (cfg, q, k, v, o, False, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first)
    if sequences is None and num_splits is None and fp8 is None:
        out, lse, _ = _C.forward(*args)
    else:
        out, lse, _ = _C.forward(*args, **(sequences or {}), num_splits=num_splits, **(fp8 or {}))
    return out, lse


def _fake_lse(q: Tensor, return_lse: bool, cu_seqlens_q) -> Tensor:
    if not return_lse:
        shape = (0,)
    elif cu_seqlens_q is not None:
        total_q, heads_q, _ = q.shape
        shape = (heads_q, total_q)
    else:
        batch, seqlen_q, heads_q, _ = q.shape
        shape = (batch, heads_q, seqlen_q)
    return q.new_empty(shape, dtype=torch.float32)


@torch.library.register_fake("flash_attention::forward")
def _forward_fake(
    q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse,
    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
    seqused_q=None, seqused_k=None, leftpad_q=None, leftpad_k=None, kv_batch_idx=None, block_table=None,
    num_splits=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
):
    return q.new_empty(q.shape, dtype=output_torch_dtype(q.dtype, out_dtype)), _fake_lse(q, return_lse, cu_seqlens_q)


@torch.library.register_fake("flash_attention::forward_out")
def _forward_out_fake(
    q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, o,
    cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
    seqused_q=None, seqused_k=None, leftpad_q=None, leftpad_k=None, kv_batch_idx=None, block_table=None,
    num_splits=None, q_descale=None, k_descale=None, v_descale=None, out_dtype=None,
):
    return _fake_lse(q, return_lse, cu_seqlens_q)


@torch.library.register_fake("flash_attention::append_to_cache")
def _append_to_cache_fake(
    q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
    rotary_interleaved, q_per_token, k_descale=None, v_descale=None,
):
    return q.new_empty(q.shape if rotary_cos is not None else (0,))


def check_no_grad(*tensors) -> None:
    """Raises where autograd would need the missing backward pass, as the operators' autograd
    kernels do: for the calls that skip the operators."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise NotImplementedError(MISSING_BACKWARD)
