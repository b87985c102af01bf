"""flash_attention as an attention implementation of Hugging Face transformers (version 5).

    import flash_attention.integrations.transformers as fa_transformers

    name = fa_transformers.register()         # "fa2_from_scratch"
    model = AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=torch.bfloat16).cuda()
    model.set_attn_implementation(name)       # or switch a model that exists

Every attention call of the model then runs our kernels, in float16 or bfloat16, on the model's own
(batch, heads, seq, d) tensors seen as (batch, seq, heads, d) views, with the model's causal flag,
scaling, softcap and sliding window, grouped key/value heads as they are (no repeat_kv). Models are
run for inference: eval mode (no attention dropout) and no autograd.

What transformers calls a mask is a pattern (causal, bidirectional, sliding window, chunks, packed
sequences, padding, ...) that it hands to the mask function registered under the same name, once
per forward (once per pattern: a model with sliding and full layers builds two). Whatever that
function, ``create_mask``, returns is what every attention layer receives as its attention_mask:

- None for the patterns the kernels compute from the causal flag and the window over all the keys
  (causal or bidirectional, with or without a sliding window, no padding). The layers run
  flash_attn_func on the views.
- A PaddedBatch for a padded batch (a 0 in the 2D attention_mask): where each batch entry's tokens
  lie among the layer's keys and queries, as the (batch,) int32 tensors leftpad and seqused.
  Each row's tokens must be one run (left or right padding), which create_mask checks (a host
  synchronization finds that some key is padding, another reads the runs). The queries are the last positions of the mask (the new tokens of a decoding
  step, too), so under causal or windowed patterns each batch entry's query run ends where its key
  run does, and the kernels' bottom-right alignment puts every mask exactly where transformers
  has it; bidirectional patterns need the keys' run alone (every query row attends its batch
  entry's tokens, as with SDPA: a cross-attention's queries are no positions of the mask at all).
  The layers run the varlen kernels on the same 4D views; the output rows of padding are 0.
- A PackedBatch for several sequences packed into one row without padding, which transformers finds
  from position_ids that restart when the model runs without a cache: their cu_seqlens, found in
  one host synchronization. The layers run flash_attn_varlen_func on q[0], k[0] and v[0], the
  (total, heads, d) views of the row.

A packed batch may also be given to the model as the keyword arguments cu_seq_lens_q, cu_seq_lens_k,
max_length_q and max_length_k (as DataCollatorWithFlattening(return_flash_attn_kwargs=True) makes
them), which reach every layer: each runs flash_attn_varlen_func with them, with or without a
cache. With a cache and only position_ids, transformers does not look for packed sequences (nor do
its sdpa and eager implementations, which then attend across them): pass use_cache=False (a
model's forward makes a cache unless told not to) or the keyword arguments.

No path copies q, k, v or the output: the transposes, q[0] and the output's unsqueeze(0) are views.
What is computed is small: the per-sequence (batch,) tensors once per forward, and in each layer an
int32 copy of cu_seq_lens given as int64 (batch + 1 entries; the kernels read int32).

Continuous batching (model.generate_batch) runs on the implementation registered as "paged|" +
name, paged_attention_forward, which register() registers too and generate_batch switches a
model to: each forward's requests are packed into one row, and each layer writes their new keys
into transformers' paged cache and runs flash_attn_varlen_func on every key the cache gathers for
them (transformers' copy; see paged_attention_forward for why not its block table).

create_mask raises NotImplementedError for what the kernels cannot run, rather than drop it: custom
patterns (or_mask/and_mask functions), block and chunked patterns, packed sequences in more than one
row, a row of the 2D attention_mask that is not one run of tokens (padding inside a sequence, as a
right-padded prompt extended by generate() has), and caches whose keys run past the queries (static
caches). "sdpa" runs what this does not.

transformers is imported inside the functions: importing this module does not import it.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import NamedTuple

import torch

import flash_attention
from flash_attention.functional import _attention
from flash_helpers.reference import attended

__all__ = [
    "IMPLEMENTATION_NAME",
    "PackedBatch",
    "PaddedBatch",
    "attention_forward",
    "create_mask",
    "paged_attention_forward",
    "register",
]

# The name the model's config and from_config/from_pretrained's attn_implementation use. It avoids
# the substrings transformers gives a meaning to: a name with "flash" is taken for a FlashAttention
# package (transformers then tries to import flash_attn or download a hub kernel), "sdpa" and
# "flex_attention" select those backends' checks, "paged|" and "/" are prefixes and hub paths.
IMPLEMENTATION_NAME = "fa2_from_scratch"
# transformers' prefix for the implementations continuous batching (generate_batch) runs: it
# switches a model to f"{PAGED_PREFIX}{name}" and calls that function with its paged cache.
PAGED_PREFIX = "paged|"
_RESERVED_IN_NAMES = ("flash", "sdpa", "flex_attention", PAGED_PREFIX, "/")

_INSTEAD = "use attn_implementation='sdpa' (or 'eager') for it"

# Keyword arguments some models or transformers' generation utilities pass to the attention
# function for features the kernels do not have, and what each is.
_UNSUPPORTED_KWARGS = {
    "position_bias": "an additive position bias (T5-style relative attention)",
    "s_aux": "attention sinks",
}


@dataclasses.dataclass(frozen=True)
class PaddedBatch:
    """What create_mask hands the attention layers for a padded batch: where each batch entry's
    tokens lie among the layer's rows, as int32 (batch,) tensors on the model's device
    (flash_attention.forward's leftpad and seqused), and the lengths they were found for."""

    leftpad_k: torch.Tensor
    seqused_k: torch.Tensor
    leftpad_q: torch.Tensor | None  # None (with seqused_q): every query row is used
    seqused_q: torch.Tensor | None
    q_length: int
    kv_length: int

    def sequence_arguments(self) -> dict:
        """The per-sequence keywords of the call."""
        names = ("leftpad_k", "seqused_k", "leftpad_q", "seqused_q")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclasses.dataclass(frozen=True)
class PackedBatch:
    """Sequences packed into one row (batch 1): flash_attn_varlen_func's cu_seqlens (int32, (sequences
    + 1,)) and longest lengths, for the queries and the keys."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def register(name: str = IMPLEMENTATION_NAME) -> str:
    """Registers ``attention_forward`` with transformers' AttentionInterface and ``create_mask``
    with its AttentionMaskInterface under ``name``, and ``paged_attention_forward`` with the
    AttentionInterface under ``"paged|" + name`` (continuous batching's), and returns ``name``;
    registering again is harmless. Both of the first are needed: transformers builds no mask at all
    for a name that has no mask function, which would drop padding silently. The paged name gets no
    mask function, as transformers' own FlashAttention ones have none: continuous batching then
    builds no mask, and each sequence's pattern comes from its cu_seq_lens.

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
    registrations = (
        (AttentionInterface, name, attention_forward),
        (AttentionMaskInterface, name, create_mask),
        (AttentionInterface, PAGED_PREFIX + name, paged_attention_forward),
    )
    for interface, key, function in registrations:
        if interface().get(key, function) is not function:
            raise ValueError(
                f"name: {key!r} is already registered in transformers' {interface.__name__} by another "
                "implementation; choose another"
            )
    for interface, key, function in registrations:
        interface.register(key, function)
    return name


def attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | PaddedBatch | PackedBatch | None,
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
      has checked that the keys end where the queries do); in a padded or packed batch, each
      sequence's own corner.
    - sliding_window w: the window (w - 1, w - 1), as transformers maps it for FlashAttention (under
      causal the right side is 0): w keys up to the query's own, or w - 1 on either side.
    - grouped key/value heads are read as they are; scaling and softcap are passed on.
    - attention_mask: what create_mask returned (see the module's docstring): None, a PaddedBatch or
      a PackedBatch. A tensor mask that arrives anyway (a 4D mask given to the model) is accepted
      only if it allows exactly the pairs computed here (reading it synchronizes).
    - cu_seq_lens_q, cu_seq_lens_k, max_length_q, max_length_k (keyword arguments of the model's
      forward, all four together): a packed batch, run with flash_attn_varlen_func as given (pass
      the lengths as ints: a tensor is read in every layer, a host synchronization each).
    - dropout > 0 (a module in training mode) raises NotImplementedError, as do the features of
      _UNSUPPORTED_KWARGS and a paged cache (continuous batching's, which the "paged|" name reads).
    """
    if kwargs.get("cache") is not None:
        raise NotImplementedError(
            f"cache: a paged cache (continuous batching) is read by the implementation registered as "
            f"{PAGED_PREFIX!r} + this one's name, which generate_batch switches the model to"
        )
    _check_unsupported(kwargs, dropout, query)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    window = (-1, -1) if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    # (batch, heads, seq, d) -> (batch, seq, heads, d): views, the last dimension stays contiguous.
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    if attention_mask is None and kwargs.keys().isdisjoint(_PACKED_KEYWORDS):
        # Every decode step of a batch without padding: the plain call, with nothing built for it
        # (a model calls this once per layer and token, and its host time is the step's).
        return flash_attention.flash_attn_func(q, k, v, 0.0, scaling, causal, window, softcap or 0.0), None
    options = {"softmax_scale": scaling, "causal": causal, "window_size": window, "softcap": softcap or 0.0}
    packed = _packed_keywords(kwargs)
    if packed is not None:
        if attention_mask is not None and not isinstance(attention_mask, PackedBatch):
            raise NotImplementedError(
                "attention_mask: a packed batch (cu_seq_lens_q and cu_seq_lens_k) has no padding, but the model "
                f"was given a padding mask too; pass one or the other, or {_INSTEAD}"
            )
        return _packed_attention(q, k, v, packed, options), None
    if isinstance(attention_mask, PackedBatch):
        return _packed_attention(q, k, v, attention_mask, options), None
    if isinstance(attention_mask, PaddedBatch):
        return _padded_attention(q, k, v, attention_mask, options), None
    if attention_mask is not None:
        _check_mask_is_computed(attention_mask, q.shape[1], k.shape[1], causal, window)
    return flash_attention.flash_attn_func(q, k, v, **options), None


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    cache=None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | dict | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | dict | None = None,
    block_table: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The AttentionInterface function of continuous batching (``model.generate_batch``), registered
    as ``"paged|" + name``: one forward of a batch of requests, each a run of new tokens (a prompt,
    a chunk of one, or a decoded token) packed into one row, against its keys in transformers'
    PagedAttentionCache.

    query is (1, heads, total_q, d) and key, value (1, heads_kv, total_q, d), the new tokens;
    cu_seq_lens_q and cu_seq_lens_k the requests' prefix sums of new tokens and of keys (a dict by
    layer type, "full_attention" or "sliding_attention", in a model that has both), with
    max_seqlen_q and max_seqlen_k. ``cache.update`` writes the new keys and values into the cache's
    pages and returns every key of the batch's requests, gathered in order at read_index (a copy
    transformers makes), and flash_attn_varlen_func runs each request causally, aligned to its last
    key (its new tokens are its last positions), with the layer's scaling, softcap and sliding
    window (w keys up to the query's own).

    That gather is the path transformers gives implementations it does not take for a FlashAttention
    package: it passes block_table (then the pages are read in place by flash_attn_with_kvcache)
    only to names with "flash" in them, which register() refuses because transformers would then
    import a FlashAttention package for them. A block_table that arrives anyway raises.

    Raises ValueError without a cache (a forward that is not continuous batching's: use the name
    without "paged|"), and NotImplementedError for dropout, attention sinks and the other features
    attention_forward refuses.
    """
    if cache is None:
        raise ValueError(
            f"cache: the {PAGED_PREFIX!r} implementation runs continuous batching's forwards, which pass a paged "
            f"cache; for any other forward use the implementation's name without {PAGED_PREFIX!r}"
        )
    if block_table is not None:
        raise NotImplementedError(
            "block_table: transformers passes a block table only to FlashAttention packages' names; this paged "
            "implementation reads the keys that cache.update gathers"
        )
    _check_unsupported(kwargs, dropout, query)
    window = (-1, -1) if not sliding_window else (sliding_window - 1, 0)
    if isinstance(cu_seq_lens_k, dict):
        layer_type = "full_attention" if window == (-1, -1) else "sliding_attention"
        cu_seq_lens_k, max_seqlen_k = cu_seq_lens_k[layer_type], max_seqlen_k[layer_type]
    # (total, heads_kv, d) each: the cache's keys and values of every request, then the new ones.
    k, v = cache.update(
        key_states=key,
        value_states=value,
        layer_idx=module.layer_idx,
        read_index=kwargs["read_index"],
        write_index=kwargs["write_index"],
    )
    out = flash_attention.flash_attn_varlen_func(
        query[0].transpose(0, 1),  # (total_q, heads, d), a view
        k,
        v,
        cu_seq_lens_q,
        cu_seq_lens_k,
        max_seqlen_q,
        max_seqlen_k,
        softmax_scale=scaling,
        causal=True,
        window_size=window,
        softcap=softcap or 0.0,
    )
    return out.unsqueeze(0), None


def _check_unsupported(kwargs: dict, dropout: float, query: torch.Tensor) -> None:
    """Raises for what both attention functions refuse: the features of _UNSUPPORTED_KWARGS,
    dropout and dtypes other than float16 and bfloat16; warns that no attention weights return."""
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
            stacklevel=3,
        )


_PACKED_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def _packed_keywords(kwargs: dict) -> PackedBatch | None:
    """The packed batch the model's forward was given as keyword arguments (transformers' names),
    or None; cu_seq_lens as int32, the kernels' type (a copy only where they are not)."""
    given = {name: kwargs.get(name) for name in _PACKED_KEYWORDS}
    if all(value is None for value in given.values()):
        return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
        raise ValueError(
            f"{missing[0]}: a packed batch is given by cu_seq_lens_q, cu_seq_lens_k, max_length_q and max_length_k "
            "together (the longest lengths as ints)"
        )
    cu_seqlens_q, cu_seqlens_k = (
        value.to(torch.int32) if isinstance(value, torch.Tensor) else value
        for value in (given["cu_seq_lens_q"], given["cu_seq_lens_k"])
    )
    return PackedBatch(cu_seqlens_q, cu_seqlens_k, given["max_length_q"], given["max_length_k"])


def _packed_attention(q, k, v, packed: PackedBatch, options: dict) -> torch.Tensor:
    """flash_attn_varlen_func on the one row of a packed batch: the (total, heads, d) views q[0],
    k[0] and v[0]; the output as the row, (1, total, heads, d)."""
    if q.shape[0] != 1:
        raise NotImplementedError(
            f"cu_seq_lens_q: flash_attention runs a packed batch as one row of sequences (batch 1), got {q.shape[0]} "
            f"rows; put every sequence in one row, or {_INSTEAD}"
        )
    out = flash_attention.flash_attn_varlen_func(
        q[0], k[0], v[0], packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_seqlen_q, packed.max_seqlen_k, **options
    )
    return out.unsqueeze(0)


def _padded_attention(q, k, v, padded: PaddedBatch, options: dict) -> torch.Tensor:
    """The varlen kernels on the (batch, seq, heads, d) views, each batch entry's tokens where
    ``padded`` says; the rows of padding come out 0."""
    if (q.shape[1], k.shape[1]) != (padded.q_length, padded.kv_length):
        raise ValueError(
            f"attention_mask: made by create_mask for {padded.q_length} queries and {padded.kv_length} keys, but "
            f"this layer has {q.shape[1]} and {k.shape[1]} (a layer whose cache holds other positions than the "
            f"mask's?); {_INSTEAD}"
        )
    return _attention(
        None, q, k, v, None, options["causal"], options["softmax_scale"], options["window_size"], options["softcap"],
        None, False, sequences=padded.sequence_arguments(),
    )


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
            f"{_describe(causal, window)} mask flash_attention computes (padding or a custom pattern?); give the "
            f"model the 2D attention_mask for padding, or {_INSTEAD}"
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
) -> PaddedBatch | PackedBatch | None:
    """The AttentionMaskInterface function: returns None (no mask: attention_forward computes the
    pattern from the causal flag and the sliding window), a PaddedBatch, a PackedBatch, or raises.

    transformers calls it once per forward with the pattern as ``mask_function`` (a function of
    batch, head, query and key positions; None meaning causal, as in transformers), the queries at
    positions q_offset .. q_offset + q_length - 1 and the keys at kv_offset .. kv_offset +
    kv_length - 1, and the 2D attention_mask (batch, positions; False or 0 at padding) the model
    was given. Returns
    - a PackedBatch where the pattern is transformers' packed-sequence pattern (position_ids that
      restart, no attention_mask, no cache) over a causal or windowed one, in one row;
    - a PaddedBatch where attention_mask masks some of the keys (positions it does not reach count
      as masked, as transformers pads it), each row's tokens being one run;
    - None otherwise.
    A 2D attention_mask is read in one host synchronization where it has no padding (every decode
    step of an unpadded batch), two where it has; a packed batch's indices in one. Raises
    NotImplementedError when
    - the pattern is not causal or bidirectional, with or without a sliding window (custom
      or_mask/and_mask functions, block or chunked attention), or packs sequences into more than
      one row;
    - the pattern depends on positions (causal or windowed) and the last key is not at the last
      query's position: bottom-right alignment would then shift it (a static cache, whose keys
      run to its maximum length);
    - a row of attention_mask is not one run of tokens among the keys.
    """
    packing = _packed_sequences(mask_function)
    pattern = mask_function if packing is None else packing.pattern
    positional = _positional(pattern)
    if positional is None:
        name = getattr(mask_function, "__qualname__", type(mask_function).__name__)
        raise NotImplementedError(
            f"mask_function: the mask pattern {name} (a custom, block or chunked pattern) is not supported by "
            f"flash_attention, which runs causal and bidirectional masks with or without a sliding window, "
            f"padded or packed; {_INSTEAD}"
        )
    last_query = int(q_offset) + q_length
    if positional and kv_offset + kv_length != last_query:
        raise NotImplementedError(
            f"kv_length: the keys are at positions {kv_offset} to {kv_offset + kv_length - 1} and the queries at "
            f"{int(q_offset)} to {last_query - 1}; flash_attention aligns masks to the last key, so the keys must "
            f"end with the queries (a static cache holds keys past them: use a dynamic cache) or {_INSTEAD}"
        )
    if packing is not None:
        return _packed_batch(packing.sequence_ids)
    if attention_mask is None:
        return None
    return _padded_batch(attention_mask, q_length, kv_length, kv_offset, positional)


def _packed_batch(sequence_ids: torch.Tensor) -> PackedBatch:
    """The PackedBatch of transformers' packed-sequence indices (batch, tokens: the index of the
    sequence each token belongs to, counting from 0 in each row)."""
    if sequence_ids.shape[0] != 1:
        raise NotImplementedError(
            f"position_ids: flash_attention runs packed sequences (position_ids that restart) in one row (batch 1), "
            f"got {sequence_ids.shape[0]} rows; put every sequence in one row, or {_INSTEAD}"
        )
    ids = sequence_ids[0]
    # Where a new sequence starts; the host needs them to size cu_seqlens and max_seqlen.
    starts = torch.nonzero((ids[1:] != ids[:-1]).cpu()).flatten() + 1
    bounds = torch.cat([starts.new_zeros(1), starts, starts.new_tensor([ids.shape[0]])])
    max_seqlen = int(bounds.diff().max())
    cu_seqlens = bounds.to(device=ids.device, dtype=torch.int32)
    return PackedBatch(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen)


def _padded_batch(
    attention_mask: torch.Tensor, q_length: int, kv_length: int, kv_offset: int, positional: bool
) -> PaddedBatch | None:
    """The PaddedBatch of a 2D attention_mask (batch, positions; True at tokens) for a layer whose
    keys are positions kv_offset .. kv_offset + kv_length - 1 and whose queries are the last
    q_length of them; None where no key is padding. One host synchronization where none is (every
    step of a generate() without padding: checked first, in the fewest operations), two where some
    is."""
    keys = attention_mask[:, kv_offset : kv_offset + kv_length]
    if keys.shape[1] == kv_length and bool(keys.all()):
        return None
    keys = keys.bool()
    if keys.shape[1] < kv_length:
        # Positions past the mask are padding, as transformers' own mask functions pad it.
        keys = torch.nn.functional.pad(keys, (0, kv_length - keys.shape[1]))
    positions = torch.arange(kv_length, device=keys.device, dtype=torch.int32)
    length = keys.sum(dim=1, dtype=torch.int32)
    start = torch.where(keys, positions, kv_length).amin(dim=1)  # kv_length where a row has no token
    end = torch.where(keys, positions + 1, 0).amax(dim=1)
    one_run = (end - start == length) | (length == 0)
    runs, first_broken = torch.stack([one_run.all().int(), (~one_run).int().argmax().int()]).tolist()
    if not runs:
        raise NotImplementedError(
            f"attention_mask: row {first_broken}'s tokens are not one run among the keys (padding inside the sequence, "
            f"as a right-padded prompt extended by generate() has); flash_attention runs left or right padding: pad "
            f"prompts on the left (tokenizer.padding_side = 'left') or {_INSTEAD}"
        )
    if not positional:
        # Every query row attends its batch entry's tokens, as with SDPA (the queries may not even be
        # positions of this mask: cross-attention).
        return PaddedBatch(start, length, None, None, q_length, kv_length)
    # The queries are the last q_length key positions: their run is the part of the keys' run there,
    # and ends where it does, so each batch entry's bottom-right corner is where transformers has it.
    shift = kv_length - q_length
    q_start = (start - shift).clamp(0, q_length)
    q_end = (start + length - shift).clamp(0, q_length)
    return PaddedBatch(start, length, q_start, q_end - q_start, q_length, kv_length)


class _PackedPattern(NamedTuple):
    pattern: object  # the pattern each packed sequence has (transformers' mask function)
    sequence_ids: torch.Tensor  # (batch, tokens): the index of the sequence of each token


def _packed_sequences(mask_function) -> _PackedPattern | None:
    """The pattern inside transformers' packed-sequence pattern, and the sequence of each token; None
    for any other pattern.

    transformers builds it (masking_utils, for position_ids that restart) as the and_mask of a
    pattern and of "the same sequence", recognised by the code object the latter's factory's
    closures share. The pattern sees the tokens' indices in the row (transformers 5.17) or, wrapped
    by remap_positions_for_packed_sequence (later versions, which have that function, recognised
    the same way), their position_ids. Both give each sequence the pattern on its own positions
    for the patterns attention_forward computes: they depend only on the distance between two
    positions, and within a sequence both indices and position_ids go up by 1 from token to token
    (transformers starts a new sequence wherever position_ids do not). Any other pattern inside is
    not recognised by _positional, so that create_mask raises.
    """
    from transformers import masking_utils

    parts = _intersected_patterns(mask_function)
    same_sequence_code = _code(masking_utils.packed_sequence_mask_function(None))
    if parts is None or len(parts) != 2 or _code(parts[1]) is not same_sequence_code:
        return None
    pattern, same_sequence = parts
    remap = getattr(masking_utils, "remap_positions_for_packed_sequence", None)
    if remap is not None and _code(pattern) is _code(remap(None, None)):
        pattern = inspect.getclosurevars(pattern).nonlocals["mask_function"]
    return _PackedPattern(pattern, inspect.getclosurevars(same_sequence).nonlocals["packed_sequence_mask"])


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
    windows = {
        masking_utils.causal_mask_function: masking_utils.sliding_window_overlay(1),
        masking_utils.bidirectional_mask_function: masking_utils.sliding_window_bidirectional_overlay(1),
    }
    parts = _intersected_patterns(mask_function) or ()
    if len(parts) == 2 and parts[1] in windows and _code(parts[0]) is _code(windows[parts[1]]):
        return True
    return None


def _intersected_patterns(mask_function) -> tuple | None:
    """The patterns that transformers' and_masks intersects in ``mask_function``; None where it is
    no and_masks pattern."""
    from transformers import masking_utils

    if _code(mask_function) is not _code(masking_utils.and_masks()):
        return None
    return inspect.getclosurevars(mask_function).nonlocals.get("mask_functions", ())


def _code(function):
    return getattr(function, "__code__", None)
