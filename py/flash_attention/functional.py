"""The calls a model makes: FlashAttention-2's entry points and signatures, PyTorch's
scaled_dot_product_attention, and forward with an explicit configuration. Each runs through the
torch operators of flash_attention.ops, so torch.compile traces them without a graph break and CUDA
graphs capture them; a plain eager call (_plain_eager) runs what the operators run without their
dispatch, which costs about as long as a small problem's kernel.

Without a configuration, one is chosen per call from the tuned dispatch table
(flash_attention.choose_config says which and why).
"""

from __future__ import annotations

import torch
from flash_helpers.families import FAMILIES

from . import ops
from .kernels import cached_config
from .ops import check_no_grad

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "forward",
    "scaled_dot_product_attention",
]

_AUTOMATIC = ""  # the operators' config argument that asks for the automatic choice


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

    cfg is a kernel configuration or its short form. q is (batch, seqlen_q, heads_q, d_head); k and
    v are (batch, seqlen_k, heads_kv, d_head), with heads_q a multiple of heads_kv (query head h
    reads key/value head h // (heads_q // heads_kv)). The lengths are any values >= 1. The masks are
    aligned to the bottom-right corner of the score matrix: with causal, query i attends key j iff
    j <= i + seqlen_k - seqlen_q; window_size (left, right) keeps
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, -1 meaning unbounded on
    that side (right is 0 with causal). softmax_scale defaults to 1/sqrt(d_head); softcap > 0 caps
    the scaled scores at softcap * tanh(score / softcap); alibi_slopes (float32, (heads_q) or
    (batch, heads_q)) adds -slope * |i + seqlen_k - seqlen_q - j|. A query row that attends no key
    outputs 0, and its lse is +inf. lse is float32, (batch, heads_q, seqlen_q), natural log. With o
    given, the output is written there. Runs on the current CUDA stream.
    """
    if not isinstance(cfg, (str, *FAMILIES.values())):
        raise TypeError(f"kernel_cfg: expected a kernel configuration or its short form, got {type(cfg).__name__}")
    return _attention(cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)


def _attention(cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first=False):
    """Runs a configuration or its short form (None: the automatic choice). A plain eager call goes
    straight to the extension, which checks every argument; anything else goes through the
    operators, which take the short form (and check it when the call runs). With heads_first, q, k,
    v and the output are (batch, heads, seq, d) (SDPA's layout; o must be None)."""
    if _plain_eager(q, k, v, o, alibi_slopes):
        check_no_grad(q, k, v, alibi_slopes)
        cfg = None if cfg is None else cached_config(cfg)
        args = (causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first)
        out, lse = ops.launch(cfg, q, k, v, o, *args)
        if o is not None:
            torch.autograd.graph.increment_version(o)  # as forward_out's dispatch marks o written
        return (out, lse) if return_lse else out
    if heads_first:
        # The operators take our layout, (batch, seq, heads, d): the transposes are views.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = _attention(cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse)
        return out.transpose(1, 2)
    _check_operator_arguments(q, k, v, o, softmax_scale, window_size, softcap, alibi_slopes)
    config = _AUTOMATIC if cfg is None else cfg if isinstance(cfg, str) else cfg.short_form()
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    args = (q, k, v, config, bool(causal), softmax_scale, list(window_size), float(softcap), alibi_slopes, bool(return_lse))
    if o is None:
        out, lse = torch.ops.flash_attention.forward(*args)
    else:
        out, lse = o, torch.ops.flash_attention.forward_out(*args, o)
    return (out, lse) if return_lse else out


def _plain_eager(q, k, v, o, alibi_slopes) -> bool:
    """Whether a call may skip the operators' dispatch (tens of microseconds on the host): eager mode
    on plain tensors (or None), with no torch.compile tracing, no dispatch or torch-function mode
    (fake tensors, functionalization, export, a device context), no functorch transform and no
    profiler (whose traces name the operator). Everything else goes through the operators."""
    return (
        type(q) is torch.Tensor
        and type(k) is torch.Tensor
        and type(v) is torch.Tensor
        and (o is None or type(o) is torch.Tensor)
        and (alibi_slopes is None or type(alibi_slopes) is torch.Tensor)
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and not torch.autograd.profiler._is_profiler_enabled
    )


def _check_operator_arguments(q, k, v, o, softmax_scale, window_size, softcap, alibi_slopes) -> None:
    """The operators' schema converts arguments with messages that name none of them: their types
    are checked here first, in the extension's words (the extension checks the values)."""
    tensors = {"q": q, "k": k, "v": v, "o": o, "alibi_slopes": alibi_slopes}
    for name, tensor in tensors.items():
        optional = name in ("o", "alibi_slopes")
        if not (isinstance(tensor, torch.Tensor) or (optional and tensor is None)):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    numbers = {"softcap": softcap} if softmax_scale is None else {"softcap": softcap, "softmax_scale": softmax_scale}
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    is_int = lambda side: isinstance(side, int) and not isinstance(side, bool)  # noqa: E731
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(map(is_int, window_size))):
        raise TypeError(f"window_size: expected a pair (left, right) of ints, got {window_size!r}")


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """FlashAttention-2's flash_attn_func: forward's semantics, the configuration chosen
    automatically. q is (batch, seqlen_q, heads_q, d); k and v are (batch, seqlen_k, heads_kv, d).

    Returns o, or with return_attn_probs (o, softmax_lse, None) as FlashAttention-2 does without
    dropout. The forward is deterministic whatever `deterministic` says (FlashAttention-2's flag
    is about its backward pass). dropout_p > 0 is not implemented and raises NotImplementedError.
    """
    _check_no_dropout(dropout_p, "dropout_p")
    del deterministic  # every call is deterministic
    result = _attention(None, q, k, v, None, causal, softmax_scale, window_size, softcap, alibi_slopes, return_attn_probs)
    return (*result, None) if return_attn_probs else result


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func on a packed (batch, seqlen, 3, heads, d) tensor: q, k and v are views of it."""
    _check_packed(qkv, "qkv", 3)
    q, k, v = qkv.unbind(dim=2)
    args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return flash_attn_func(q, k, v, *args)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_func with k and v packed into one (batch, seqlen_k, 2, heads_kv, d) tensor."""
    _check_packed(kv, "kv", 2)
    k, v = kv.unbind(dim=2)
    args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return flash_attn_func(q, k, v, *args)


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch.nn.functional.scaled_dot_product_attention's signature and semantics, on our kernels.

    query is (batch, heads_q, seqlen_q, d); key and value are (batch, heads_kv, seqlen_k, d), and
    heads_kv may differ from heads_q only with enable_gqa. is_causal aligns the mask to the top-left
    corner, as PyTorch does: query i attends key j iff j <= i. attn_mask is accepted only where it
    changes nothing (a boolean mask that is all True, or an additive mask that is all zeros: this
    reads the mask, so it synchronizes); any other mask raises NotImplementedError. Returns
    (batch, heads_q, seqlen_q, d).
    """
    _check_no_dropout(dropout_p, "dropout_p")
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        name = next(n for n, t in zip(("query", "key", "value"), tensors) if not isinstance(t, torch.Tensor) or t.dim() != 4)
        raise ValueError(f"{name}: expected a 4-dimensional (batch, heads, seqlen, d) tensor")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(
            f"enable_gqa: query has {query.shape[1]} heads and key {key.shape[1]}; pass enable_gqa=True "
            "for grouped-query attention"
        )
    if attn_mask is not None:
        if is_causal:
            raise ValueError("attn_mask: must be None when is_causal is set, as in PyTorch")
        _check_mask_changes_nothing(attn_mask)
    seqlen_q, seqlen_k = query.shape[2], key.shape[2]
    window_size = (-1, -1)
    if is_causal:
        if seqlen_q < seqlen_k:
            # Query i attends keys j <= i < seqlen_q: the first seqlen_q keys under the bottom-right
            # mask, which then coincides with the top-left one.
            key, value = key[:, :, :seqlen_q], value[:, :, :seqlen_q]
        elif seqlen_q > seqlen_k:
            # The bottom-right window reaching seqlen_q - seqlen_k keys past the diagonal is j <= i.
            window_size = (-1, seqlen_q - seqlen_k)
    causal = is_causal and seqlen_q <= seqlen_k
    return _attention(None, query, key, value, None, causal, scale, window_size, 0.0, None, False, heads_first=True)


def _check_no_dropout(dropout_p, name: str) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"{name}: dropout is not implemented (got {dropout_p}); pass 0.0")


def _check_packed(packed, name: str, count: int) -> None:
    if not isinstance(packed, torch.Tensor) or packed.dim() != 5 or packed.shape[2] != count:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"{name}: expected a (batch, seqlen, {count}, heads, d) tensor, got {shape}")


def _check_mask_changes_nothing(attn_mask) -> None:
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask: expected a tensor or None, got {type(attn_mask).__name__}")
    no_op = bool(attn_mask.all()) if attn_mask.dtype == torch.bool else not bool(attn_mask.any())
    if not no_op:
        raise NotImplementedError(
            "attn_mask: only masks that change nothing are supported (all True, or all zeros); use "
            "is_causal for a causal mask, or torch.nn.functional.scaled_dot_product_attention for others"
        )
