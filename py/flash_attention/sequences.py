"""The per-sequence arguments of a call whose batch holds sequences of different lengths
(FlashAttention-2's cu_seqlens and max_seqlen, FlashAttention-3's seqused, and leftpad) or reads
its keys and values through an index (kv_batch_idx: a cache's entry per sequence; block_table: a
paged cache's pages), gathered as the extension and the torch operators take them: as keywords,
only those given (a dense call passes none of them on).
"""

from __future__ import annotations

import torch

__all__ = ["MAX_SEQLEN_ARGUMENTS", "sequence_arguments"]

# The per-sequence arguments that are lengths (ints); the others are int32 tensors.
MAX_SEQLEN_ARGUMENTS = ("max_seqlen_q", "max_seqlen_k")


def sequence_arguments(
    *,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    seqused_q=None,
    seqused_k=None,
    leftpad_q=None,
    leftpad_k=None,
    kv_batch_idx=None,
    block_table=None,
) -> dict:
    """The per-sequence arguments that were given (not None), by name.

    A max_seqlen given as a 0-dim integer tensor (as transformers computes it) becomes an int:
    reading it synchronizes with the GPU, and torch.compile breaks the graph there; pass ints to
    avoid both. Other types are left for the extension and the operators' checks to name.
    """
    given = {
        "cu_seqlens_q": cu_seqlens_q,
        "cu_seqlens_k": cu_seqlens_k,
        "max_seqlen_q": _as_length(max_seqlen_q, "max_seqlen_q"),
        "max_seqlen_k": _as_length(max_seqlen_k, "max_seqlen_k"),
        "seqused_q": seqused_q,
        "seqused_k": seqused_k,
        "leftpad_q": leftpad_q,
        "leftpad_k": leftpad_k,
        "kv_batch_idx": kv_batch_idx,
        "block_table": block_table,
    }
    return {name: value for name, value in given.items() if value is not None}


def _as_length(value, name: str):
    """An int from a 0-dim integer tensor; anything else as it is."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() != 0 or value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(
            f"{name}: expected an int or a 0-dim integer tensor, got a {value.dtype} tensor of shape {tuple(value.shape)}"
        )
    return int(value)
