"""Attention against a KV cache (decoding): FlashAttention-2's flash_attn_with_kvcache.

A step appends its new keys and values to the cache in place, optionally rotates q and the new
keys (rotary embedding), then attends each sequence's cached keys. Everything runs on the GPU
without reading the lengths on the host, so a step is captured once by a CUDA graph and replayed
as the lengths grow (cache_seqlens a tensor). The attention is the varlen kernels' with seqused_k
(the keys each sequence uses), leftpad_k (cache_leftpad), kv_batch_idx (cache_batch_idx) and
block_table (a paged cache), split over the keys where the heuristic finds the GPU would otherwise
idle (num_splits=0), and with up to 16 queries per sequence and grouped heads, on each query's
heads of a group packed into one block.
"""

from __future__ import annotations

import torch

from . import sequence_checks
from .functional import _attention
from .sequences import sequence_arguments

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
    cache_batch_idx or cache_leftpad (FlashAttention-2's rule). Paged caches run on the SM80
    family's kernels.

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

    """
    if block_table is not None and (cache_batch_idx is not None or cache_leftpad is not None):
        other = "cache_batch_idx" if cache_batch_idx is not None else "cache_leftpad"
        raise ValueError(f"{other}: is not given with block_table (a paged sequence starts at its first page)")
    for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(f"{name}: expected a 4-D tensor (batch, seq, heads, d)")
    if (k is None) != (v is None):
        raise ValueError("k, v: give both new keys and new values, or neither")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos, rotary_sin: give both, or neither")
    batch = q.shape[0]
    seqlens = _cache_seqlens(cache_seqlens, batch, q.device)
    leftpad = cache_leftpad
    if leftpad is not None:
        _check_per_sequence(leftpad, "cache_leftpad", batch, q.device)
    if cache_batch_idx is not None:
        _check_per_sequence(cache_batch_idx, "cache_batch_idx", batch, q.device)
    rows = _CacheRows(k_cache, cache_batch_idx, block_table, batch, q.device)
    if not torch.compiler.is_compiling() and sequence_checks.requested():
        sequence_checks.check_cache_contents(rows.capacity, 0 if k is None else k.shape[1], seqlens, leftpad)
    local = causal or tuple(window_size) != (-1, -1)
    if rotary_cos is not None:
        q = _rotate(q, rotary_cos, rotary_sin, seqlens, rotary_interleaved, per_token=local, name="q")
    new_keys = 0
    if k is not None:
        if k.dim() != 4 or v.shape != k.shape or k.shape[0] != batch:
            raise ValueError(
                f"k, v: expected (batch, seqlen_new, heads_kv, d) with q's batch {batch}, got {tuple(k.shape)} and "
                f"{tuple(v.shape)}"
            )
        if rotary_cos is not None:
            k = _rotate(k, rotary_cos, rotary_sin, seqlens, rotary_interleaved, per_token=True, name="k")
        where = rows.of(seqlens, k.shape[1])
        _append(k_cache, k, where, "k_cache")
        _append(v_cache, v, where, "v_cache")
        new_keys = k.shape[1]
    # The keys each sequence attends, counted from its first valid row (the lengths themselves where
    # nothing moves them: a decode step without new keys launches no kernel for them).
    used = seqlens
    if new_keys:
        used = used + new_keys
    if leftpad is not None:
        used = used - leftpad
    sequences = sequence_arguments(
        seqused_k=used.to(torch.int32), leftpad_k=leftpad, kv_batch_idx=cache_batch_idx, block_table=block_table
    )
    return _attention(
        None, q, k_cache, v_cache, None, causal, softmax_scale, window_size, softcap, alibi_slopes, return_softmax_lse,
        sequences=sequences, num_splits=num_splits,
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


class _CacheRows:
    """Where a sequence's cache rows are: (batch entry, row) of k_cache, through cache_batch_idx or
    a paged cache's block_table where given. Indices past the cache are clamped into it, as the
    kernels clamp theirs, so a bad entry never writes out of bounds."""

    def __init__(self, k_cache, cache_batch_idx, block_table, batch: int, device):
        self.cache_entries, self.entry_rows = k_cache.shape[0], k_cache.shape[1]
        self.batch_idx, self.block_table = cache_batch_idx, block_table
        if block_table is not None:
            tensor = isinstance(block_table, torch.Tensor)
            shape_ok = tensor and block_table.dim() == 2 and block_table.shape[0] == batch and block_table.shape[1] >= 1
            if not shape_ok or block_table.dtype != torch.int32:
                described = (
                    f"a {block_table.dtype} tensor of shape {tuple(block_table.shape)}" if tensor
                    else type(block_table).__name__
                )
                raise ValueError(
                    f"block_table: expected an int32 tensor of shape ({batch}, pages_per_sequence >= 1), got {described}"
                )
            if block_table.device != device:
                raise ValueError(f"block_table: on {block_table.device}, q on {device}")
            self.capacity = block_table.shape[1] * self.entry_rows
        else:
            self.capacity = self.entry_rows
        self.batch, self.device = batch, device

    def of(self, seqlens: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(entries, rows), each (batch, n): where key positions seqlens[b] .. seqlens[b] + n - 1 are."""
        if self.cache_entries < 1 or self.capacity < 1:
            raise ValueError("k_cache: has no rows to append the new keys to")
        positions = seqlens.long()[:, None] + torch.arange(n, device=self.device)
        positions = positions.clamp_(0, max(self.capacity - 1, 0))
        if self.block_table is not None:
            slots = positions // self.entry_rows
            pages = self.block_table.long().gather(1, slots).clamp_(0, self.cache_entries - 1)
            return pages, positions % self.entry_rows
        if self.batch_idx is not None:
            entries = self.batch_idx.long().clamp(0, self.cache_entries - 1)[:, None]
        else:
            entries = torch.arange(self.batch, device=self.device)[:, None]
        return entries.expand_as(positions), positions


def _append(cache: torch.Tensor, new: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor], name: str) -> None:
    """Writes new (batch, n, heads, d) into the cache at ``where`` (_CacheRows.of's), in place."""
    if cache.shape[2:] != new.shape[2:] or cache.dtype != new.dtype or cache.device != new.device:
        raise ValueError(
            f"{name}: new rows {tuple(new.shape)} ({new.dtype}, {new.device}) do not fit the cache "
            f"{tuple(cache.shape)} ({cache.dtype}, {cache.device})"
        )
    entries, rows = where
    cache[entries, rows] = new


def _rotate(x, cos, sin, seqlens, interleaved: bool, per_token: bool, name: str) -> torch.Tensor:
    """x (batch, n, heads, d) with its first rotary_dim columns rotated at positions seqlens[b] + i
    (per_token) or seqlens[b], a new tensor; computed in float32."""
    if cos.dim() != 2 or sin.shape != cos.shape:
        raise ValueError(f"rotary_cos, rotary_sin: expected two (seqlen_ro, rotary_dim / 2) tensors, got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    half = cos.shape[1]
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_cos: rotary_dim {rotary_dim} is more than {name}'s d {x.shape[-1]}")
    positions = seqlens.long()[:, None] + (torch.arange(x.shape[1], device=x.device) if per_token else 0)
    positions = positions.clamp(0, cos.shape[0] - 1)
    c = cos.float()[positions][:, :, None, :]  # (batch, n, 1, half)
    s = sin.float()[positions][:, :, None, :]
    rotated = x[..., :rotary_dim].float()
    if interleaved:
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
        out = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = rotated[..., :half], rotated[..., half:]
        out = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)
