"""Attention against a KV cache (decoding): FlashAttention-2's flash_attn_with_kvcache.

A step appends its new keys and values to the cache in place and rotates q and the new keys
(rotary embedding), both in one kernel (the operator flash_attention::append_to_cache, which
declares the cache's mutation), then attends each sequence's cached keys. Everything runs on the GPU
without reading the lengths on the host, so a step is captured once by a CUDA graph and replayed
as the lengths grow (cache_seqlens a tensor). The attention is the varlen kernels' with seqused_k
(the keys each sequence uses), leftpad_k (cache_leftpad), kv_batch_idx (cache_batch_idx) and
block_table (a paged cache), split over the keys where the heuristic finds the GPU would otherwise
idle (num_splits=0), and with up to 16 queries per sequence and grouped heads, on each query's
heads of a group packed into one block.

The cache may be float8_e4m3fn (a quantised cache, as serving engines keep one) while the queries
stay 16-bit: the append quantises the new keys and values as it writes them, and the attention
dequantises them by k_descale and v_descale, FlashAttention-3's factors.
"""

from __future__ import annotations

import torch

from . import _C, sequence_checks
from .fp8 import fp8_arguments
from .functional import _attention, _plain_eager
from .ops import check_no_grad

__all__ = ["flash_attn_with_kvcache"]


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
):
    """FlashAttention-2's flash_attn_with_kvcache.

    q is (batch, seqlen_q, heads_q, d); k_cache and v_cache are (batch_cache, seqlen_cache,
    heads_kv, d), batch_cache being q's batch unless cache_batch_idx (int32 (batch,)) names the
    entry each sequence uses. cache_seqlens (an int, or int32 (batch,)) is each sequence's cache
    length before this step; cache_leftpad (int32 (batch,)) the index of its first valid cache row
    (default 0), so sequence b's keys are cache rows cache_leftpad[b] .. cache_seqlens[b] - 1, then
    the new ones.

    With block_table (int32 (batch, pages_per_sequence)) the cache is paged: k_cache and v_cache
    are (num_pages, page_size, heads_kv, d), page_size a multiple of 16 (16 is vLLM's default), and
    sequence b's row j is row j % page_size of page block_table[b, j // page_size]. Not with
    cache_batch_idx or cache_leftpad (FlashAttention-2's rule). Both families' kernels read paged
    caches (forward's block_table says which the automatic choice takes).

    k and v (batch, seqlen_new, heads_kv, d), given together, are written into the cache in place at
    rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 (clamped to the cache), and attended
    with it. rotary_cos and rotary_sin (seqlen_ro, rotary_dim / 2) rotate the first rotary_dim
    columns of q and of the new k at their cache positions: the new keys at cache_seqlens[b] + i;
    the queries at cache_seqlens[b] + i with causal or a window, else all at cache_seqlens[b].
    rotary_interleaved pairs columns (0, 1), (2, 3), ... (GPT-J); otherwise i with i + rotary_dim / 2
    (GPT-NeoX). The caller's q and k are not modified. Nothing reads cache_seqlens or cache_leftpad
    on the host (the kernels and the append clamp contents past the cache);
    FLASH_ATTENTION_CHECK_SEQLENS=1 makes each call read them first and raise ValueError naming the
    one that breaks a rule (flash_attention.sequence_checks).

    softmax_scale, causal, window_size, softcap and alibi_slopes are flash_attn_func's, aligned to
    each sequence's last key. num_splits: blocks sharing each query block's keys, 0 for the
    heuristic's count. Returns o (batch, seqlen_q, heads_q, d), and with return_softmax_lse also
    lse (batch, heads_q, seqlen_q).

    k_cache and v_cache hold q's dtype (float16 or bfloat16), or both float8_e4m3fn (a quantised
    cache) with q, k and v still 16-bit. k_descale and v_descale (float32, (batch, heads_kv), any
    strides, on q's device; None stands for factors of 1) are then their dequantisation factors, as
    FlashAttention-3's: the key attended is the stored value times k_descale[b, h]. New keys (rotated
    first, in float32) and values are stored as value / descale[b, h] computed in float32, rounded to
    the nearest even e4m3 value, finite values saturating at +-448 (NaN stays NaN). Such a cache's
    d_head and its strides but the last are multiples of 16 elements, its data 16-byte aligned: the
    kernels read its rows in 16-byte chunks. The output is q's dtype. float8_e4m3fn q against an
    e4m3 cache (FlashAttention-3's FP8 call, q_descale its factors) attends it on the Hopper family's
    E4M3 configurations, without new keys and values (nothing is appended from e4m3 q), and gives a
    bfloat16 output.

    """
    if block_table is not None and (cache_batch_idx is not None or cache_leftpad is not None):
        other = "cache_batch_idx" if cache_batch_idx is not None else "cache_leftpad"
        raise ValueError(f"{other}: is not given with block_table (a paged sequence starts at its first page)")
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor (batch, seq, heads, d)")
    appends = k is not None or v is not None or rotary_cos is not None or rotary_sin is not None
    if appends:
        optional_tensors = (
            ("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin), ("k_descale", k_descale),
            ("v_descale", v_descale),
        )  # fmt: skip
        for name, tensor in optional_tensors:
            if tensor is not None and not isinstance(tensor, torch.Tensor):
                raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(tensor).__name__}")
    batch = q.shape[0]
    seqlens = _cache_seqlens(cache_seqlens, batch, q.device)
    leftpad = cache_leftpad
    if leftpad is not None:
        _check_per_sequence(leftpad, "cache_leftpad", batch, q.device)
    if cache_batch_idx is not None:
        _check_per_sequence(cache_batch_idx, "cache_batch_idx", batch, q.device)
    capacity = _capacity(k_cache, block_table, batch, q.device)
    new_keys = 0 if k is None else k.shape[1]
    if not torch.compiler.is_compiling() and sequence_checks.requested():
        sequence_checks.check_cache_contents(capacity, new_keys, seqlens, leftpad)
    if appends:
        # Queries are rotated at their own positions where a mask tells them apart, else all at the
        # cache's end (FlashAttention-2's rule).
        per_token = causal or tuple(window_size) != (-1, -1)
        arguments = (
            q, k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin,
            bool(rotary_interleaved), per_token, k_descale, v_descale,
        )  # fmt: skip
        tensors = (
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_batch_idx, block_table, seqlens, k_descale, v_descale,
        )  # fmt: skip
        if _plain_eager(tensors):
            check_no_grad(q, k_cache, v_cache, k, v, k_descale, v_descale)
            rotated = _C.append_to_cache(*arguments)
            torch.autograd.graph.increment_version((k_cache, v_cache))  # as the operator marks them written
        else:
            rotated = torch.ops.flash_attention.append_to_cache(*arguments)
        if rotary_cos is not None:
            q = rotated
    # The keys each sequence attends, counted from its first valid row (the lengths themselves where
    # nothing moves them: a decode step without new keys launches no kernel for them). The
    # per-sequence keywords are built here (sequences.sequence_arguments' form, its checks needless
    # for these tensors): a decode step's host time is counted in microseconds.
    used = seqlens
    if new_keys:
        used = used + new_keys
    sequences = {"seqused_k": used}
    if leftpad is not None:
        sequences["seqused_k"] = used - leftpad
        sequences["leftpad_k"] = leftpad
    if cache_batch_idx is not None:
        sequences["kv_batch_idx"] = cache_batch_idx
    if block_table is not None:
        sequences["block_table"] = block_table
    # The factors given (None where none is: a 16-bit call passes none on).
    fp8 = fp8_arguments(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    return _attention(
        None, q, k_cache, v_cache, None, causal, softmax_scale, window_size, softcap, alibi_slopes, return_softmax_lse,
        sequences=sequences, num_splits=num_splits, fp8=fp8,
    )


def _check_per_sequence(tensor, name: str, batch: int, device) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32 or tuple(tensor.shape) != (batch,):
        described = f"a {tensor.dtype} tensor of shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise ValueError(f"{name}: expected an int32 tensor of shape ({batch},), got {described}")
    if tensor.device != device:
        raise ValueError(f"{name}: on {tensor.device}, q on {device}")


def _cache_seqlens(cache_seqlens, batch: int, device) -> torch.Tensor:
    """cache_seqlens as an int32 (batch,) tensor on q's device."""
    if cache_seqlens is None:
        raise ValueError("cache_seqlens: required (an int, or an int32 tensor of shape (batch,))")
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        if cache_seqlens < 0:
            raise ValueError(f"cache_seqlens: must be >= 0, got {cache_seqlens}")
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    _check_per_sequence(cache_seqlens, "cache_seqlens", batch, device)
    return cache_seqlens


def _capacity(k_cache, block_table, batch: int, device) -> int:
    """The rows a sequence's cache holds: a batch entry's, or with block_table its pages'."""
    if block_table is None:
        return k_cache.shape[1]
    tensor = isinstance(block_table, torch.Tensor)
    shape_ok = tensor and block_table.dim() == 2 and block_table.shape[0] == batch and block_table.shape[1] >= 1
    if not shape_ok or block_table.dtype != torch.int32:
        described = f"a {block_table.dtype} tensor of shape {tuple(block_table.shape)}" if tensor else type(block_table).__name__
        raise ValueError(f"block_table: expected an int32 tensor of shape ({batch}, pages_per_sequence >= 1), got {described}")
    if block_table.device != device:
        raise ValueError(f"block_table: on {block_table.device}, q on {device}")
    return block_table.shape[1] * k_cache.shape[1]
