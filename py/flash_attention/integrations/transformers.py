"""flash_attention as an attention implementation of Hugging Face transformers (version 5).

    import flash_attention.integrations.transformers as fa_transformers

    name = fa_transformers.register()         # "fa2_from_scratch"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=torch.bfloat16).cuda()
    model.set_attn_implementation(name)       # or switch a model that exists

Every attention call of the model then runs flash_attn_func, in float16 or bfloat16, on the
model's own (batch, heads, seq, d) tensors seen as (batch, seq, heads, d) views (no copies; grouped
key/value heads as they are, no repeat_kv), with the model's causal flag, scaling, softcap and
sliding window. Models are run for inference: eval mode (no attention dropout) and no autograd.

What transformers calls a mask is a pattern (causal, bidirectional, sliding window, chunks, packed
sequences, padding, ...) that it hands to the mask function registered under the same name, once
per forward. Ours, ``create_mask``, makes it hand the attention function nothing when the pattern
is one the kernels compute from the causal flag and the window (causal or bidirectional, with or
without a sliding window, over all the keys, with the last key at the last query's position), and
raises for everything else: a padded batch (a 0 in the 2D attention_mask), custom, packed-sequence,
block or chunked patterns, and caches whose keys run past the queries (static caches). Nothing is
dropped silently; "sdpa" runs what this does not.

transformers is imported inside the functions: importing this module does not import it.
"""

from __future__ import annotations

import inspect
import warnings

import torch

import flash_attention
from flash_helpers.reference import attended

__all__ = ["IMPLEMENTATION_NAME", "attention_forward", "create_mask", "register"]

# The name the model's config and from_config/from_pretrained's attn_implementation use. It avoids
# the substrings transformers gives a meaning to: a name with "flash" is taken for a FlashAttention
# package (transformers then tries to import flash_attn or download a hub kernel), "sdpa" and
# "flex_attention" select those backends' checks, "paged|" and "/" are prefixes and hub paths.
IMPLEMENTATION_NAME = "fa2_from_scratch"
_RESERVED_IN_NAMES = ("flash", "sdpa", "flex_attention", "paged|", "/")

_INSTEAD = "use attn_implementation='sdpa' (or 'eager') for it"

# Keyword arguments some models or transformers' generation utilities pass to the attention
# function for features the kernels do not have, and what each is.
_UNSUPPORTED_KWARGS = {
    "position_bias": "an additive position bias (T5-style relative attention)",
    "s_aux": "attention sinks",
    "cache": "a paged cache (continuous batching)",
    "cu_seq_lens_q": "a padding-free (packed) batch",
    "cu_seq_lens_k": "a padding-free (packed) batch",
}


def register(name: str = IMPLEMENTATION_NAME) -> str:
    """Registers ``attention_forward`` with transformers' AttentionInterface and ``create_mask``
    with its AttentionMaskInterface under ``name``, and returns ``name``; registering again is
    harmless. Both are needed: transformers builds no mask at all for a name that has no mask
    function, which would drop padding silently.

    Raises ImportError without transformers 5, and ValueError for a name transformers reserves or
    another implementation holds.
    """
    try:
        import transformers
        from transformers import AttentionInterface, AttentionMaskInterface
    except ImportError as error:
        raise ImportError(
            "register: the transformers integration needs transformers 5 or newer: pip install transformers"
        ) from error
    if int(transformers.__version__.split(".")[0]) < 5:
        raise ImportError(
            f"register: the transformers integration needs transformers 5 or newer, found {transformers.__version__}: "
            "pip install -U transformers"
        )
    reserved = [part for part in _RESERVED_IN_NAMES if part in name]
    if reserved or name == "eager":
        raise ValueError(
            f"name: {name!r} is an attention implementation name transformers gives a meaning to "
            f"({', '.join(map(repr, reserved)) or 'eager'}); choose another, e.g. {IMPLEMENTATION_NAME!r}"
        )
    for interface, function in ((AttentionInterface(), attention_forward), (AttentionMaskInterface(), create_mask)):
        if interface.get(name, function) is not function:
            raise ValueError(
                f"name: {name!r} is already registered in transformers' {type(interface).__name__} by another "
                "implementation; choose another"
            )
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, create_mask)
    return name


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The AttentionInterface function: attention over transformers' (batch, heads, seq, d) query,
    key and value, returned as ((batch, seq, heads, d) output, None), as transformers' sdpa
    function returns it (no attention weights).

    - causal: ``is_causal`` if given, else the module's ``is_causal``. The mask is aligned to the
      bottom-right corner, as in transformers' flash_attention_2 path: with a cache the queries are
      the last positions, and query i attends the keys up to i + seqlen_k - seqlen_q (create_mask
      has checked that the keys end where the queries do).
    - sliding_window w: the window (w - 1, w - 1), as transformers maps it for FlashAttention (under
      causal the right side is 0): w keys up to the query's own, or w - 1 on either side.
    - grouped key/value heads are read as they are; scaling and softcap are passed on.
    - dropout > 0 (a module in training mode) raises NotImplementedError, as do the features of
      _UNSUPPORTED_KWARGS. A mask that arrives anyway (a 4D mask given to the model) is accepted
      only if it allows exactly the pairs computed here (reading it synchronizes).
    """
    for name, what in _UNSUPPORTED_KWARGS.items():
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{name}: {what} is not supported by flash_attention; {_INSTEAD}")
    if dropout > 0:
        raise NotImplementedError(
            f"dropout: attention dropout ({dropout}) is not implemented by flash_attention; transformers asks "
            "for it only from a module in training mode: call model.eval()"
        )
    if query.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(
            f"query: flash_attention runs float16 and bfloat16 models, this one computes attention in "
            f"{query.dtype}; load it with dtype=torch.float16 or torch.bfloat16"
        )
    if kwargs.get("output_attentions"):
        warnings.warn(
            "output_attentions: flash_attention returns no attention weights (None), as sdpa does; "
            "use attn_implementation='eager' for them",
            stacklevel=2,
        )
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    # (batch, heads, seq, d) -> (batch, seq, heads, d): views, the last dimension stays contiguous.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    if attention_mask is not None:
        _check_mask_is_computed(attention_mask, q.shape[1], k.shape[1], causal, window)
    out = flash_attention.flash_attn_func(
        q, k, v, softmax_scale=scaling, causal=causal, window_size=window, softcap=softcap or 0.0
    )
    return out, None


def _check_mask_is_computed(attention_mask: torch.Tensor, seqlen_q: int, seqlen_k: int, causal: bool, window) -> None:
    """Raises unless the (..., seqlen_q, seqlen_k) mask, boolean (True: attend) or additive (0:
    attend, the dtype's minimum or -inf: not), allows exactly the pairs that ``causal`` and
    ``window`` give (transformers runs such a mask in place of both)."""
    if attention_mask.dtype == torch.bool:
        allowed = attention_mask
    elif attention_mask.is_floating_point():
        allowed = attention_mask == 0
        if not (allowed | (attention_mask <= torch.finfo(attention_mask.dtype).min)).all():
            raise NotImplementedError(
                f"attention_mask: an additive mask with values other than 0 and -inf (a bias) is not supported by "
                f"flash_attention; {_INSTEAD}"
            )
    else:
        raise TypeError(f"attention_mask: expected a boolean or floating-point mask, got {attention_mask.dtype}")
    expected = attended(seqlen_q, seqlen_k, causal=causal, window_size=window, device=attention_mask.device)
    if tuple(allowed.shape[-2:]) != (seqlen_q, seqlen_k) or not torch.equal(allowed, expected.expand_as(allowed)):
        raise NotImplementedError(
            f"attention_mask: a {tuple(attention_mask.shape)} mask reached the attention function that is not the "
            f"{_describe(causal, window)} mask flash_attention computes (padding or a custom pattern?); remove "
            f"the padding or {_INSTEAD}"
        )


def _describe(causal: bool, window) -> str:
    kind = "causal" if causal else "bidirectional"
    return kind if window == (-1, -1) else f"{kind} sliding-window {window}"


def create_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function=None,
    attention_mask: torch.Tensor | None = None,
    **kwargs,
) -> None:
    """The AttentionMaskInterface function: returns None (no mask: attention_forward computes the
    pattern from the causal flag and the sliding window) or raises.

    transformers calls it once per forward with the pattern as ``mask_function`` (a function of
    batch, head, query and key positions; None meaning causal, as in transformers), the queries at
    positions q_offset .. q_offset + q_length - 1 and the keys at kv_offset .. kv_offset +
    kv_length - 1, and the 2D attention_mask (batch, positions; False or 0 at padding) the model
    was given. Raises NotImplementedError when
    - attention_mask masks any of the keys (padding; positions it does not reach count as masked);
    - the pattern is not causal or bidirectional, with or without a sliding window (custom
      or_mask/and_mask functions, packed sequences, block or chunked attention);
    - the pattern depends on positions (causal or windowed) and the last key is not at the last
      query's position: bottom-right alignment would then shift it (a static cache, whose keys
      run to its maximum length).
    """
    if attention_mask is not None:
        keys = attention_mask[:, kv_offset : kv_offset + kv_length]
        if keys.shape[-1] < kv_length or not keys.all():
            raise NotImplementedError(
                "attention_mask: padding masks (a 0 in the 2D attention_mask) are not supported by flash_attention "
                f"yet; remove the padding (batch sequences of equal length, or one at a time) or {_INSTEAD}"
            )
    positional = _positional(mask_function)
    if positional is None:
        name = getattr(mask_function, "__qualname__", type(mask_function).__name__)
        raise NotImplementedError(
            f"mask_function: the mask pattern {name} (a custom, packed-sequence, block or chunked pattern) is "
            f"not supported by flash_attention, which runs causal and bidirectional masks with or without a "
            f"sliding window; {_INSTEAD}"
        )
    last_query = int(q_offset) + q_length
    if positional and kv_offset + kv_length != last_query:
        raise NotImplementedError(
            f"kv_length: the keys are at positions {kv_offset} to {kv_offset + kv_length - 1} and the queries at "
            f"{int(q_offset)} to {last_query - 1}; flash_attention aligns masks to the last key, so the keys must "
            f"end with the queries (a static cache holds keys past them: use a dynamic cache) or {_INSTEAD}"
        )


def _positional(mask_function) -> bool | None:
    """Whether the transformers mask pattern ``mask_function`` depends on the query and key
    positions (causal, or a sliding window: True) or not (bidirectional: False); None for a
    pattern attention_forward does not compute.

    transformers builds patterns by composing closures; the sliding windows are and_masks of a
    window overlay and the causal or bidirectional function. They are recognised by identity and
    by the code object their factory's closures share, and anything else (other compositions,
    patterns of a later transformers version) is not recognised: it raises rather than run a
    different mask.
    """
    from transformers import masking_utils

    base_patterns = {masking_utils.causal_mask_function: True, masking_utils.bidirectional_mask_function: False}
    if mask_function is None:
        return True
    if mask_function in base_patterns:
        return base_patterns[mask_function]
    if _code(mask_function) is not _code(masking_utils.and_masks()):
        return None
    windows = {
        masking_utils.causal_mask_function: masking_utils.sliding_window_overlay(1),
        masking_utils.bidirectional_mask_function: masking_utils.sliding_window_bidirectional_overlay(1),
    }
    parts = inspect.getclosurevars(mask_function).nonlocals.get("mask_functions", ())
    if len(parts) == 2 and parts[1] in windows and _code(parts[0]) is _code(windows[parts[1]]):
        return True
    return None


def _code(function):
    return getattr(function, "__code__", None)
