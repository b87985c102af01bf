"""The calls a model makes: FlashAttention-2's entry points and signatures (flash_attn_func,
flash_attn_varlen_func and their packed forms), PyTorch's scaled_dot_product_attention (dense or
on nested jagged tensors), and forward with an explicit configuration. Each runs through the torch
operators of flash_attention.ops, so torch.compile traces them without a graph break and CUDA
graphs capture them; a plain eager call (_plain_eager) runs what the operators run without their
dispatch, which costs about as long as a small problem's kernel.

Without a configuration, one is chosen per call from the tuned dispatch table
(flash_attention.choose_config says which and why).

Batches of sequences of different lengths (cu_seqlens, seqused, leftpad) run the varlen kernels;
their contents are not read (the kernels clamp what breaks the rules), except under
FLASH_ATTENTION_CHECK_SEQLENS=1 (flash_attention.sequence_checks).

FP8 inputs (torch.float8_e4m3fn q, k and v, FlashAttention-3's q_descale, k_descale, v_descale and
a 16-bit output) run on the Hopper family's kernels (sm_90), dense or per sequence; an FP8 cache
(e4m3 k and v with k_descale and v_descale beside 16-bit q) on the SM80 family's decoding
configurations; the SDPA entry point takes 16-bit inputs only.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from flash_helpers.families import FAMILIES

from . import ops, sequence_checks
from .fp8 import DESCALES, fp8_arguments
from .kernels import cached_config
from .ops import check_no_grad
from .sequences import MAX_SEQLEN_ARGUMENTS, sequence_arguments

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
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
    num_splits=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """Attention with FlashAttention-2's semantics; returns o, or (o, lse) with return_lse.

    cfg is a kernel configuration, its short form, or None for the automatic choice (choose_config's).
    q is (batch, seqlen_q, heads_q, d_head); k and v are (batch, seqlen_k, heads_kv, d_head), with
    heads_q a multiple of heads_kv (query head h reads key/value head h // (heads_q // heads_kv)).
    d_head is any size up to 256: a configuration of a larger d_head runs it with zero columns past
    it (README, "Head sizes"). The lengths are any values >= 1. The masks are aligned to the
    bottom-right corner of the score matrix: with causal, query i attends key j iff
    j <= i + seqlen_k - seqlen_q; window_size (left, right) keeps
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, -1 meaning unbounded on
    that side (right is 0 with causal). softmax_scale defaults to 1/sqrt(d_head); softcap > 0 caps
    the scaled scores at softcap * tanh(score / softcap); alibi_slopes (float32, (heads_q) or
    (batch, heads_q)) adds -slope * |i + seqlen_k - seqlen_q - j|. A query row that attends no key
    outputs 0, and its lse is +inf. lse is float32, (batch, heads_q, seqlen_q), natural log. With o
    given, the output is written there. Runs on the current CUDA stream.

    Sequences of different lengths in one batch (the varlen kernels; int32 CUDA tensors):
    - cu_seqlens_q and cu_seqlens_k, given together, (batch + 1,) prefix sums, with max_seqlen_q
      and max_seqlen_k (ints: the longest sequence on each side): q is (total_q, heads_q, d_head),
      k and v are (total_k, heads_kv, d_head), and sequence b is the rows cu_seqlens[b] ..
      cu_seqlens[b + 1] - 1 (its slot). o has q's shape and lse is (heads_q, total_q). Rows of o
      outside [cu_seqlens_q[0], cu_seqlens_q[-1]) are not written.
    - seqused_q, seqused_k (batch,): sequence b uses that many rows of its slot (FlashAttention-3's
      seqused); leftpad_q, leftpad_k (batch,): its used rows start that many rows into the slot.
      Without cu_seqlens (max_seqlen is then not given), each batch entry of the 4-D q, k and v is
      a slot. With either, the rows of o that no sequence uses are 0 and their lse +inf.
    - kv_batch_idx (batch,): sequence b's keys and values are batch entry kv_batch_idx[b] of the
      4-D k and v, whose batch may differ from q's (a cache with more entries than the batch: FA2's
      cache_batch_idx). Not with cu_seqlens or block_table.
    - block_table (batch, pages_per_sequence): k and v are a paged cache, (num_pages, page_size,
      heads_kv, d_head) with page_size a multiple of 16, and sequence b's key j is row
      j % page_size of page block_table[b, j // page_size]. Sequence b has seqused_k[b] keys,
      else cu_seqlens_k[b + 1] - cu_seqlens_k[b], else all that its pages hold (q is 4-D, or
      packed with cu_seqlens). Not with leftpad_k. Both families read paged caches (the automatic
      choice leaves pages of fewer than 64 rows to the SM80 family, which reads them faster).
    - Every rule above applies to each sequence with its own lengths: its used queries attend its
      used keys, the masks and the ALiBi distance aligned to its bottom-right corner.
    - Their contents are not read, so nothing synchronizes; the kernels clamp contents that break
      the rules (a wrong answer, never an access out of bounds). FLASH_ATTENTION_CHECK_SEQLENS=1 in
      the environment makes every such call read them first and raise ValueError naming the
      argument that breaks a rule (flash_attention.sequence_checks).

    num_splits: how many blocks share each query block's keys (split-KV, for few queries against
    many keys: decoding), their partial results merged by a combine kernel; 0 lets a heuristic
    choose from the shapes, None (the default) runs cfg whole (1). Only the SM80 family's kernels
    split, with their varlen variant.

    FP8 (FlashAttention-3's): q, k and v all torch.float8_e4m3fn run on the Hopper family's E4M3
    configurations (sm_90 only; d_head up to 256, served by the compiled E4M3 head sizes, 64, 128
    and 256 in a default build), dense or with the per-sequence arguments (paged too), whole (a
    named configuration refuses num_splits > 1). The values attended are query head h's times
    q_descale[b, h // (heads_q // heads_kv)] and key/value head h's times k_descale[b, h] and
    v_descale[b, h]: each descale a float32 tensor of shape (batch, heads_kv) on q's device, any
    strides (an expanded scalar too), None meaning factors of 1. o is
    out_dtype, torch.bfloat16 (the default) or torch.float16, and so must a given o be; lse is
    float32 as always. Forward only: an input (or descale) that requires grad raises with grad mode
    on. The descales and out_dtype are refused with 16-bit inputs (out_dtype may only repeat q's
    dtype), but for an FP8 cache: k and v of torch.float8_e4m3fn beside float16 or bfloat16 q,
    dequantised by k_descale and v_descale as above (q_descale refused), run on the SM80 family's
    decoding configurations (d_head up to 128: 64 and 128 in a default build), which read the e4m3
    tiles and widen them to float16 in registers; whole or split, dense, per sequence or paged; o has
    q's dtype.
    """
    if cfg is not None and not isinstance(cfg, (str, *FAMILIES.values())):
        raise TypeError(
            f"kernel_cfg: expected a kernel configuration, its short form or None, got {type(cfg).__name__}"
        )
    # One chain of identity tests (all ten None): what a dense call pays for them.
    if (
        cu_seqlens_q is cu_seqlens_k is max_seqlen_q is max_seqlen_k
        is seqused_q is seqused_k is leftpad_q is leftpad_k is kv_batch_idx is block_table is None
    ):
        sequences = None
    else:
        sequences = sequence_arguments(
            cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            seqused_q=seqused_q,
            seqused_k=seqused_k,
            leftpad_q=leftpad_q,
            leftpad_k=leftpad_k,
            kv_batch_idx=kv_batch_idx,
            block_table=block_table,
        )
    fp8 = fp8_arguments(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)
    return _attention(
        cfg, q, k, v, o, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, sequences=sequences,
        num_splits=num_splits, fp8=fp8,
    )


def _attention(
    cfg,
    q,
    k,
    v,
    o,
    causal,
    softmax_scale,
    window_size,
    softcap,
    alibi_slopes,
    return_lse,
    heads_first=False,
    sequences=None,
    num_splits=None,
    fp8=None,
):
    """Runs a configuration or its short form (None: the automatic choice). A plain eager call goes
    straight to the extension, which checks every argument; anything else goes through the
    operators, which take the short form (and check it when the call runs). With heads_first, q, k,
    v and the output are (batch, heads, seq, d) (SDPA's layout; o must be None). ``sequences``: the
    per-sequence arguments given (sequences.sequence_arguments), None for a dense call. num_splits:
    None for the extension's default (the heuristic's without a configuration, 1 with one). ``fp8``:
    the FP8 arguments given (fp8.fp8_arguments), None for none."""
    if sequences is not None and not torch.compiler.is_compiling() and sequence_checks.requested():
        sequence_checks.check_sequence_contents(q, k, sequences)
    descales = (None, None, None) if fp8 is None else tuple(fp8.get(name) for name in DESCALES)
    if _plain_eager((q, k, v, o, alibi_slopes, *descales), sequences):
        check_no_grad(q, k, v, alibi_slopes, *descales)
        cfg = None if cfg is None else cached_config(cfg)
        args = (
            causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, heads_first, sequences, num_splits, fp8,
        )  # fmt: skip
        out, lse = ops.launch(cfg, q, k, v, o, *args)
        if o is not None:
            torch.autograd.graph.increment_version(o)  # as forward_out's dispatch marks o written
        return (out, lse) if return_lse else out
    if heads_first:
        # The operators take our layout, (batch, seq, heads, d): the transposes are views.
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    _check_operator_arguments(q, k, v, o, softmax_scale, window_size, softcap, alibi_slopes, sequences, fp8)
    config = _AUTOMATIC if cfg is None else cfg if isinstance(cfg, str) else cfg.short_form()
    softmax_scale = None if softmax_scale is None else float(softmax_scale)
    args = (q, k, v, config, bool(causal), softmax_scale, list(window_size), float(softcap), alibi_slopes, bool(return_lse))
    keywords = {**(sequences or {}), **(fp8 or {})}
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, int):
            raise TypeError(f"num_splits: expected an int, got {type(num_splits).__name__}")
        keywords["num_splits"] = num_splits
    if o is None:
        out, lse = torch.ops.flash_attention.forward(*args, **keywords)
    else:
        out, lse = o, torch.ops.flash_attention.forward_out(*args, o, **keywords)
    if heads_first:
        out = out.transpose(1, 2)
    return (out, lse) if return_lse else out


def _plain_eager(tensors: tuple, sequences=None) -> bool:
    """Whether a call may skip the operators' dispatch (tens of microseconds on the host): eager mode
    on plain tensors (``tensors`` plain or None, ``sequences``' values plain tensors or ints), with
    no torch.compile tracing, no dispatch or torch-function mode (fake tensors, functionalization,
    export, a device context), no functorch transform and no profiler (whose traces name the
    operator). Everything else goes through the operators."""
    for tensor in tensors:
        if tensor is not None and type(tensor) is not torch.Tensor:
            return False
    return (
        (sequences is None or all(type(value) in (torch.Tensor, int) for value in sequences.values()))
        and not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and not torch._C._is_torch_function_mode_enabled()
        and not torch._C._are_functorch_transforms_active()
        and not torch.autograd.profiler._is_profiler_enabled
    )


def _check_operator_arguments(q, k, v, o, softmax_scale, window_size, softcap, alibi_slopes, sequences, fp8) -> None:
    """The operators' schema converts arguments with messages that name none of them: their types
    are checked here first, in the extension's words (the extension checks the values)."""
    fp8 = fp8 or {}
    descales = {name: fp8.get(name) for name in DESCALES}
    tensors = {"q": q, "k": k, "v": v, "o": o, "alibi_slopes": alibi_slopes, **descales}
    for name, tensor in tensors.items():
        optional = name not in ("q", "k", "v")
        if not (isinstance(tensor, torch.Tensor) or (optional and tensor is None)):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(tensor).__name__}")
    out_dtype = fp8.get("out_dtype")
    if out_dtype is not None and not isinstance(out_dtype, torch.dtype):
        raise TypeError(
            f"out_dtype: expected a torch.dtype (torch.bfloat16 or torch.float16), got {type(out_dtype).__name__}"
        )
    numbers = {"softcap": softcap} if softmax_scale is None else {"softcap": softcap, "softmax_scale": softmax_scale}
    for name, value in numbers.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name}: expected a float, got {type(value).__name__}")
    is_int = lambda side: isinstance(side, int) and not isinstance(side, bool)  # noqa: E731
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(map(is_int, window_size))):
        raise TypeError(f"window_size: expected a pair (left, right) of ints, got {window_size!r}")
    for name, value in (sequences or {}).items():
        if name in MAX_SEQLEN_ARGUMENTS:
            # Under torch.compile a length may be symbolic (torch.SymInt).
            if isinstance(value, bool) or not isinstance(value, (int, torch.SymInt)):
                raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
        elif not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(value).__name__}")


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
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """FlashAttention-2's flash_attn_func: forward's semantics, the configuration chosen
    automatically. q is (batch, seqlen_q, heads_q, d); k and v are (batch, seqlen_k, heads_kv, d).

    Returns o, or with return_attn_probs (o, softmax_lse, None) as FlashAttention-2 does without
    dropout. The forward is deterministic whatever `deterministic` says (FlashAttention-2's flag
    is about its backward pass). dropout_p > 0 is not implemented and raises NotImplementedError.

    FP8 (FlashAttention-3's keywords): q, k and v of torch.float8_e4m3fn, dequantised by q_descale,
    k_descale and v_descale (float32, (batch, heads_kv); None: 1), give an o of out_dtype
    (torch.bfloat16 by default, or torch.float16); on sm_90 only, forward only (forward's docstring
    has the rules).
    """
    fp8 = fp8_arguments(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)
    return _flash_attn(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        fp8=fp8,
    )


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    seqused_q=None,
    seqused_k=None,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    out_dtype=None,
):
    """FlashAttention-2's flash_attn_varlen_func (with FlashAttention-3's seqused_q and seqused_k):
    a batch of sequences of different lengths, packed, the configuration chosen automatically.
    With block_table (int32 CUDA, (batch, pages_per_sequence)), k and v are a paged cache
    (num_pages, page_size, heads_kv, d), page_size a multiple of 16, sequence b's key j being row
    j % page_size of page block_table[b, j // page_size]; cu_seqlens_k then gives the lengths only.

    q is (total_q, heads_q, d) and k, v are (total_k, heads_kv, d); cu_seqlens_q and cu_seqlens_k
    (int32 CUDA, (batch + 1,)) are the prefix sums of the lengths, sequence b being the rows
    cu_seqlens[b] .. cu_seqlens[b + 1] - 1; max_seqlen_q and max_seqlen_k are the longest lengths
    (ints; a 0-dim tensor is read, which synchronizes). seqused_q and seqused_k (int32 CUDA,
    (batch,)) let sequence b use only that many rows from the start of its slot. Each sequence is
    attended on its own with flash_attn_func's semantics: causal and window_size aligned to its own
    bottom-right corner, ALiBi likewise. Returns o (total_q, heads_q, d), or with
    return_attn_probs (o, softmax_lse, None), softmax_lse float32 (heads_q, total_q). Rows outside
    [cu_seqlens_q[0], cu_seqlens_q[-1]) are not written; with seqused, every row no sequence uses
    is 0. The contents of cu_seqlens and seqused are not read: FLASH_ATTENTION_CHECK_SEQLENS=1
    checks them on every call (forward's docstring has the rules). FP8 as flash_attn_func's:
    float8_e4m3fn q, k and v with q_descale, k_descale and v_descale ((number of sequences,
    heads_kv), a factor per sequence) and out_dtype, or an FP8 cache (float8_e4m3fn k and v beside
    16-bit q, k_descale and v_descale).
    """
    sequences = sequence_arguments(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        block_table=block_table,
    )
    fp8 = fp8_arguments(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype)
    return _flash_attn(
        q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
        sequences, fp8,
    )


def _flash_attn(
    q,
    k,
    v,
    dropout_p,
    softmax_scale,
    causal,
    window_size,
    softcap,
    alibi_slopes,
    deterministic,
    return_attn_probs,
    sequences=None,
    fp8=None,
):
    """What FlashAttention-2's entry points share: no dropout, the automatic choice, and
    (o, lse, None) with return_attn_probs."""
    _check_no_dropout(dropout_p, "dropout_p")
    del deterministic  # every call is deterministic
    result = _attention(
        None, q, k, v, None, causal, softmax_scale, window_size, softcap, alibi_slopes, return_attn_probs,
        sequences=sequences, fp8=fp8,
    )
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
    q, k, v = _unpack(qkv, "qkv", _QKV)
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
    k, v = _unpack(kv, "kv", _KV)
    args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return flash_attn_func(q, k, v, *args)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func on a packed (total, 3, heads, d) tensor: q, k and v are views of it,
    and share cu_seqlens and max_seqlen."""
    q, k, v = _unpack(qkv, "qkv", _VARLEN_QKV)
    args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, *args)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """flash_attn_varlen_func with k and v packed into one (total_k, 2, heads_kv, d) tensor."""
    k, v = _unpack(kv, "kv", _VARLEN_KV)
    args = (dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *args)


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch.nn.functional.scaled_dot_product_attention's signature and semantics, on our kernels.

    query is (batch, heads_q, seqlen_q, d); key and value are (batch, heads_kv, seqlen_k, d), and
    heads_kv may differ from heads_q only with enable_gqa. is_causal aligns the mask to the top-left
    corner, as PyTorch does: query i attends key j iff j <= i. attn_mask is accepted only where it
    changes nothing (a boolean mask that is all True, or an additive mask that is all zeros: this
    reads the mask, so it synchronizes); any other mask raises NotImplementedError. Returns
    (batch, heads_q, seqlen_q, d). float8_e4m3fn inputs raise NotImplementedError (flash_attn_func
    takes them, with their descales).

    query, key and value may also be nested tensors of layout torch.jagged, (batch, heads, j, d)
    with the sequence dimension ragged, as PyTorch's SDPA takes them: each sequence is attended on
    its own (the varlen kernels read the nested tensors' values in place), and the output is a
    nested tensor with query's offsets. Nested tensors take no attn_mask, and is_causal needs each
    query sequence as long as its key sequence (there the top-left mask is the bottom-right one).
    """
    _check_no_dropout(dropout_p, "dropout_p")
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        name = next(n for n, t in zip(("query", "key", "value"), tensors) if not isinstance(t, torch.Tensor) or t.dim() != 4)
        raise ValueError(f"{name}: expected a 4-dimensional (batch, heads, seqlen, d) tensor")
    for name, tensor in zip(("query", "key", "value"), tensors):
        if tensor.dtype == torch.float8_e4m3fn:
            raise NotImplementedError(
                f"{name}: float8_e4m3fn inputs are not supported here (scaled_dot_product_attention takes no descales "
                "or output dtype); call flash_attn_func with (batch, seq, heads, d) tensors and q_descale, k_descale, "
                "v_descale and out_dtype"
            )
    if query.is_nested or key.is_nested or value.is_nested:
        return _jagged_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise _grouped_heads_error(query, key)
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


def _grouped_heads_error(query, key) -> ValueError:
    return ValueError(
        f"enable_gqa: query has {query.shape[1]} heads and key {key.shape[1]}; pass enable_gqa=True "
        "for grouped-query attention"
    )


def _jagged_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa):
    """scaled_dot_product_attention on (batch, heads, j, d) nested jagged tensors: the varlen call on
    their values, (total, heads, d) views, with their offsets as cu_seqlens (an int32 copy of batch
    + 1 entries) and their longest sequences (cached in the nested tensors, computed and cached
    there where not: that reads the offsets, which synchronizes)."""
    tensors = {"query": query, "key": key, "value": value}
    nested = next(name for name, tensor in tensors.items() if tensor.is_nested)
    for name, tensor in tensors.items():
        if not tensor.is_nested:
            raise TypeError(
                f"{name}: is a dense tensor but {nested} is nested; pass query, key and value all nested "
                "(layout=torch.jagged) or all dense"
            )
        if tensor.layout != torch.jagged:
            raise TypeError(f"{name}: nested tensors must have layout torch.jagged, got {tensor.layout}")
        if tensor._ragged_idx != 2:
            raise ValueError(
                f"{name}: expected a (batch, heads, j, d) nested tensor whose sequence dimension (2) is ragged, got "
                f"one ragged in dimension {tensor._ragged_idx}"
            )
        if tensor.lengths() is not None:
            raise NotImplementedError(
                f"{name}: nested tensors with holes (lengths() given) are not supported; pass {name}.contiguous()"
            )
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise _grouped_heads_error(query, key)
    if attn_mask is not None:
        raise NotImplementedError("attn_mask: nested tensors take no mask (nor does PyTorch's SDPA on them)")
    if not _same_sequences(key, value):
        raise ValueError("value: its sequences must be key's (the same offsets)")
    if is_causal and not _same_sequences(query, key):
        raise NotImplementedError(
            "is_causal: with nested tensors, only where each query sequence is as long as its key sequence "
            "(query and key with the same offsets), where the top-left mask is the bottom-right one"
        )
    # (batch, j, heads, d): the layout whose values are the (total, heads, d) rows the kernels read.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    sequences = {
        "cu_seqlens_q": q.offsets().to(torch.int32),
        "cu_seqlens_k": k.offsets().to(torch.int32),
        "max_seqlen_q": q._get_max_seqlen(),
        "max_seqlen_k": k._get_max_seqlen(),
    }
    out = _attention(
        None, q.values(), k.values(), v.values(), None, is_causal, scale, (-1, -1), 0.0, None, False, sequences=sequences
    )
    jagged = torch.nested.nested_tensor_from_jagged(
        out, q.offsets(), min_seqlen=q._maybe_min_seqlen, max_seqlen=q._maybe_max_seqlen
    )
    return jagged.transpose(1, 2)


def _same_sequences(a, b) -> bool:
    """Whether two nested jagged tensors hold sequences of the same lengths: at once where they
    share their offsets (the same ragged size), else by reading both offsets (a synchronization)."""
    return a.shape[2] == b.shape[2] or torch.equal(a.offsets(), b.offsets())


def _check_no_dropout(dropout_p, name: str) -> None:
    if dropout_p != 0.0:
        raise NotImplementedError(f"{name}: dropout is not implemented (got {dropout_p}); pass 0.0")


class _Packing(NamedTuple):
    """How a packed tensor holds q, k and v (or k and v): its shape in words (for messages), its
    rank, and the dimension that holds them and its size."""

    shape: str
    rank: int
    dim: int
    count: int


_QKV = _Packing("(batch, seqlen, 3, heads, d)", 5, 2, 3)
_KV = _Packing("(batch, seqlen, 2, heads, d)", 5, 2, 2)
_VARLEN_QKV = _Packing("(total, 3, heads, d)", 4, 1, 3)
_VARLEN_KV = _Packing("(total_k, 2, heads, d)", 4, 1, 2)


def _unpack(packed, name: str, packing: _Packing) -> tuple:
    """The views of the tensors ``packed`` holds."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != packing.rank or packed.shape[packing.dim] != packing.count:
        shape = tuple(packed.shape) if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise ValueError(f"{name}: expected a {packing.shape} tensor, got {shape}")
    return packed.unbind(dim=packing.dim)


def _check_mask_changes_nothing(attn_mask) -> None:
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask: expected a tensor or None, got {type(attn_mask).__name__}")
    no_op = bool(attn_mask.all()) if attn_mask.dtype == torch.bool else not bool(attn_mask.any())
    if not no_op:
        raise NotImplementedError(
            "attn_mask: only masks that change nothing are supported (all True, or all zeros); use "
            "is_causal for a causal mask, or torch.nn.functional.scaled_dot_product_attention for others"
        )
