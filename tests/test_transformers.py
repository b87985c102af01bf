"""The transformers integration (flash_attention.integrations.transformers).

Without a GPU: registration, and the mask function through transformers' own mask builders
(create_causal_mask and its siblings, as models call them): no mask for the patterns the kernels
compute, padded batches accepted, packed batches found (from the pattern transformers builds, and
from the patterns of transformers 5.17 and of later versions), an error for custom, chunked and
static-cache patterns; the cu_seqlens every layer of a model gets for a padding-free batch; the
attention function's errors (dropout, float32, masks it does not compute, unsupported features).

With a GPU (the ``gpu`` marker): real models built from configurations with random weights (BERT,
ViT at 224 px, Llama with grouped and multi-query attention at head sizes 64 and 128, Mistral with
a sliding window, Gemma 2 with softcap and alternating sliding layers), in float16 and bfloat16,
eval mode, under inference_mode. Each output is compared with the same weights on SDPA (eager for
Gemma 2, which SDPA refuses) by the criterion of the other tests: ref32 is the model in float32,
ref16 the model in the test dtype, and ours must satisfy max|ours - ref32| <= 2 * max|ref16 -
ref32| + 1e-5 and a relative norm error below 1e-2, or below twice ref16's where a whole model in
the test dtype is further than 1e-2 from float32 (bfloat16 decoders, see _assert_matches). Every
attention layer must have run through flash_attn_func. Decoding with a KV cache (a prompt, a chunk
of several tokens, single tokens) and generate() are compared the same way. Batches of sequences of
their own lengths: a right-padded BERT batch against SDPA (padding positions not compared), a
left-padded batched greedy generate() against SDPA's, a packed (padding-free) batch, as
DataCollatorWithFlattening makes it, against each sequence run alone, and continuous batching
(generate_batch on the "paged|" implementation) against the reference's paged implementation.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")
transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed: pip install transformers to test the integration"
)

import helpers  # noqa: E402
from flash_helpers.reference import MAX_RELATIVE_NORM_ERROR  # noqa: E402
from transformers import AttentionInterface, AttentionMaskInterface, masking_utils  # noqa: E402

pytestmark = pytest.mark.skipif(not helpers.extension_is_built(), reason=helpers.NOT_BUILT_REASON)

if helpers.extension_is_built():
    import flash_attention
    from flash_attention.integrations import transformers as integration

gpu = pytest.mark.gpu


@pytest.fixture
def name() -> str:
    return integration.register()


# ----------------------------------------------------------------------------------------------
# Registration


def test_register_is_idempotent_and_fills_both_interfaces():
    first = integration.register()
    assert first == integration.IMPLEMENTATION_NAME
    assert integration.register() == first
    assert AttentionInterface()[first] is integration.attention_forward
    assert AttentionMaskInterface()[first] is integration.create_mask
    paged = f"paged|{first}"
    assert AttentionInterface()[paged] is integration.paged_attention_forward
    # No mask function: continuous batching then builds no mask for it, as for FlashAttention's.
    assert paged not in AttentionMaskInterface._global_mapping


def test_register_under_another_name():
    assert integration.register("fa_test_name") == "fa_test_name"
    assert AttentionInterface()["fa_test_name"] is integration.attention_forward
    assert AttentionInterface()["paged|fa_test_name"] is integration.paged_attention_forward


@pytest.mark.parametrize("reserved", ["flash_attention_from_scratch", "my_sdpa", "org/kernel", "eager"])
def test_register_rejects_names_transformers_reserves(reserved):
    with pytest.raises(ValueError, match="name: "):
        integration.register(reserved)


def test_register_rejects_a_name_another_implementation_holds(monkeypatch):
    monkeypatch.setitem(AttentionInterface._global_mapping, "taken_name", lambda *args, **kwargs: None)
    with pytest.raises(ValueError, match="already registered"):
        integration.register("taken_name")
    monkeypatch.setitem(AttentionInterface._global_mapping, "paged|taken_paged", lambda *args, **kwargs: None)
    with pytest.raises(ValueError, match=re.escape("'paged|taken_paged' is already registered")):
        integration.register("taken_paged")
    assert "taken_paged" not in AttentionInterface._global_mapping, "registered in part"


def test_models_take_the_paged_name(name):
    model = transformers.AutoModelForCausalLM.from_config(_decoder_config(name), attn_implementation=f"paged|{name}")
    assert model.config._attn_implementation == f"paged|{name}"


def test_models_take_the_name(name):
    model = transformers.AutoModel.from_config(_bert_config(), attn_implementation=name)
    assert model.config._attn_implementation == name
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation(name)
    assert model.config._attn_implementation == name


def test_importing_flash_attention_does_not_import_transformers():
    code = (
        "import sys, flash_attention, flash_attention.integrations.transformers\n"
        "assert 'transformers' not in sys.modules, 'transformers was imported'\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


# ----------------------------------------------------------------------------------------------
# The mask function, called by transformers' mask builders (no GPU: the masks are built on the CPU)

BATCH, SEQ, HIDDEN = 2, 16, 64


def _decoder_config(name: str, config_class=None, **overrides):
    """A tiny decoder's configuration (Llama unless ``config_class`` says otherwise), its attention
    implementation ``name``: the mask builders read the implementation from it."""
    options = {
        "vocab_size": 100,
        "hidden_size": HIDDEN,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "pad_token_id": 0,
    }
    config_class = config_class or transformers.LlamaConfig
    return config_class(**{**options, **overrides}, attn_implementation=name)


def _ones(length: int = SEQ) -> torch.Tensor:
    return torch.ones(BATCH, length, dtype=torch.long)


def _with_padding(length: int = SEQ, left: bool = False) -> torch.Tensor:
    mask = _ones(length)
    mask[1, 0 if left else -1] = 0
    return mask


def _dynamic_cache(config, past: int):
    """A DynamicCache holding ``past`` positions in every layer."""
    cache = transformers.DynamicCache(config=config)
    head_dim = config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        states = torch.zeros(BATCH, config.num_key_value_heads, past, head_dim)
        cache.update(states, states, layer)
    return cache


# transformers' mask builders, as models call them (once per forward, before any attention runs).
BUILDERS = {
    "causal": masking_utils.create_causal_mask,
    "bidirectional": masking_utils.create_bidirectional_mask,
    "sliding_window": masking_utils.create_sliding_window_causal_mask,
    "bidirectional_sliding_window": masking_utils.create_bidirectional_sliding_window_mask,
    "chunked": masking_utils.create_chunked_causal_mask,
}


def _build_mask(builder: str, config, seq: int = SEQ, attention_mask=None, past_key_values=None, **kwargs):
    """What ``builder`` hands the attention function for ``seq`` new tokens (our create_mask's result)."""
    return BUILDERS[builder](
        config=config,
        inputs_embeds=torch.zeros(BATCH, seq, HIDDEN),
        attention_mask=attention_mask,
        past_key_values=past_key_values,
        **kwargs,
    )


@pytest.mark.parametrize("attention_mask", [None, "ones"])
@pytest.mark.parametrize("builder", ["causal", "bidirectional", "sliding_window", "bidirectional_sliding_window"])
def test_mask_is_none_without_padding(name, builder, attention_mask):
    config = _decoder_config(name, sliding_window=4)
    assert _build_mask(builder, config, attention_mask=_ones() if attention_mask == "ones" else None) is None


@pytest.mark.parametrize("left", [False, True], ids=["right_padding", "left_padding"])
@pytest.mark.parametrize("builder", ["causal", "bidirectional"])
def test_padding_is_accepted(name, builder, left):
    """Padded batches run as batches of sequences of their own lengths (the GPU tests compare them)."""
    _build_mask(builder, _decoder_config(name), attention_mask=_with_padding(left=left))


@pytest.mark.parametrize("seq", [1, 3], ids=["decode", "chunk"])
def test_mask_is_none_with_a_dynamic_cache(name, seq):
    config = _decoder_config(name)
    cache = _dynamic_cache(config, 10)
    assert _build_mask("causal", config, seq, attention_mask=_ones(10 + seq), past_key_values=cache) is None


def test_left_padding_in_the_cache_is_accepted(name):
    """Decoding a left-padded batch: the padding stays at the start of the cached keys."""
    config = _decoder_config(name)
    cache = _dynamic_cache(config, 10)
    _build_mask("causal", config, 1, attention_mask=_with_padding(11, left=True), past_key_values=cache)


@pytest.mark.parametrize("past", [0, 3, 20], ids=["empty", "filling", "full"])
def test_sliding_window_cache_is_aligned(name, past):
    """A sliding-window layer's cache keeps only the window's last keys (kv_offset > 0 once full)."""
    config = _decoder_config(name, transformers.MistralConfig, sliding_window=8)
    cache = _dynamic_cache(config, past) if past else transformers.DynamicCache(config=config)
    assert _build_mask("sliding_window", config, 1, past_key_values=cache) is None


def test_static_cache_raises(name):
    """A static cache's keys run to its maximum length, past the queries."""
    config = _decoder_config(name)
    cache = transformers.StaticCache(config=config, max_cache_len=64)
    with pytest.raises(NotImplementedError, match="static cache"):
        _build_mask("causal", config, past_key_values=cache)


# Several sequences in one row, told apart by position_ids that restart (a padding-free batch): 6
# tokens, then 10.
PACKED_POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]])
PACKED_CU_SEQLENS = [0, 6, 16]


def _assert_packed_batch(packed) -> None:
    assert isinstance(packed, integration.PackedBatch), packed
    for cu_seqlens in (packed.cu_seqlens_q, packed.cu_seqlens_k):
        assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == PACKED_CU_SEQLENS
    assert (packed.max_seqlen_q, packed.max_seqlen_k) == (10, 10)


@pytest.mark.parametrize("builder", ["causal", "sliding_window"])
def test_packed_sequences_make_a_packed_batch(name, builder):
    config = _decoder_config(name, sliding_window=4)
    packed = BUILDERS[builder](
        config=config, inputs_embeds=torch.zeros(1, SEQ, HIDDEN), attention_mask=None, past_key_values=None,
        position_ids=PACKED_POSITIONS,
    )  # fmt: skip
    _assert_packed_batch(packed)


def _packed_in_row_indices(pattern, sequence_ids):
    """transformers 5.17's packed-sequence pattern: ``pattern`` on the tokens' indices in the row."""
    return masking_utils.and_masks(pattern, masking_utils.packed_sequence_mask_function(sequence_ids))


def _packed_in_sequence_positions(pattern, sequence_ids):
    """Later versions' packed-sequence pattern: ``pattern`` on the tokens' position_ids."""
    if not hasattr(masking_utils, "remap_positions_for_packed_sequence"):
        pytest.skip(f"transformers {transformers.__version__} has no remap_positions_for_packed_sequence")
    remapped = masking_utils.remap_positions_for_packed_sequence(pattern, PACKED_POSITIONS)
    return _packed_in_row_indices(remapped, sequence_ids)


@pytest.mark.parametrize("window", [None, 4], ids=["causal", "sliding_window"])
@pytest.mark.parametrize("packing", [_packed_in_row_indices, _packed_in_sequence_positions])
def test_packed_patterns_of_every_version_are_recognised(packing, window):
    pattern = masking_utils.causal_mask_function
    if window is not None:
        pattern = masking_utils.sliding_window_causal_mask_function(window)
    mask_function = packing(pattern, masking_utils.find_packed_sequence_indices(PACKED_POSITIONS))
    _assert_packed_batch(integration.create_mask(1, SEQ, SEQ, mask_function=mask_function))


def test_packed_custom_patterns_raise(name):
    """A custom pattern inside the packed-sequence pattern is not dropped."""

    def first_token_everywhere(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx == 0

    with pytest.raises(NotImplementedError, match="mask_function: "):
        masking_utils.create_causal_mask(
            config=_decoder_config(name), inputs_embeds=torch.zeros(1, SEQ, HIDDEN), attention_mask=None,
            past_key_values=None, position_ids=PACKED_POSITIONS, and_mask_function=first_token_everywhere,
        )  # fmt: skip


@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
@pytest.mark.parametrize("model", ["llama", "mistral_sliding_window"])
def test_padding_free_batch_reaches_every_layer_packed(name, monkeypatch, model, flash_kwargs):
    """A DataCollatorWithFlattening batch through a model (use_cache=False: transformers looks for
    packed sequences in position_ids only without a cache): every layer runs flash_attn_varlen_func
    (recorded here, in place of the kernels) with the sequences' cu_seqlens and the model's mask."""
    calls = []

    def recorded(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, **options):
        calls.append(([t.tolist() for t in (cu_seqlens_q, cu_seqlens_k)], (max_seqlen_q, max_seqlen_k), options))
        return torch.zeros_like(q)

    monkeypatch.setattr(flash_attention, "flash_attn_varlen_func", recorded)
    sliding = model == "mistral_sliding_window"
    config_class = transformers.MistralConfig if sliding else transformers.LlamaConfig
    config = _decoder_config(name, config_class, sliding_window=4)
    decoder = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=torch.bfloat16)
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs, return_tensors="pt")
    batch = collator([{"input_ids": list(range(1, 7))}, {"input_ids": list(range(1, 11))}])
    batch.pop("labels")
    assert batch["position_ids"].tolist() == PACKED_POSITIONS.tolist()
    with torch.inference_mode():
        decoder.eval()(**batch, use_cache=False)
    window = (3, 3) if sliding else (-1, -1)
    assert len(calls) == config.num_hidden_layers
    for cu_seqlens, max_seqlens, options in calls:
        assert cu_seqlens == [PACKED_CU_SEQLENS] * 2 and max_seqlens == (10, 10)
        assert options["causal"] and options["window_size"] == window


@pytest.mark.parametrize("combine", ["or_mask_function", "and_mask_function"])
def test_custom_patterns_raise(name, combine):
    def first_token_everywhere(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx == 0

    with pytest.raises(NotImplementedError, match="mask_function: "):
        _build_mask("causal", _decoder_config(name), **{combine: first_token_everywhere})


def test_chunked_attention_raises(name):
    with pytest.raises(NotImplementedError, match="mask_function: "):
        _build_mask("chunked", _decoder_config(name, attention_chunk_size=8))


# ----------------------------------------------------------------------------------------------
# The attention function's checks (no GPU: each raises before any kernel runs)


class _Attention(torch.nn.Module):
    is_causal = True


def _qkv(dtype=torch.float16, seq: int = SEQ):
    query = torch.zeros(BATCH, 4, seq, 64, dtype=dtype)
    key = value = torch.zeros(BATCH, 2, seq, 64, dtype=dtype)
    return query, key, value


def test_dropout_raises():
    with pytest.raises(NotImplementedError, match="dropout: .* model.eval"):
        integration.attention_forward(_Attention(), *_qkv(), None, dropout=0.1)


def test_float32_raises():
    with pytest.raises(TypeError, match="query: .*float16 or torch.bfloat16"):
        integration.attention_forward(_Attention(), *_qkv(torch.float32), None)


@pytest.mark.parametrize("feature", ["position_bias", "s_aux", "cache"])
def test_unsupported_features_raise(feature):
    with pytest.raises(NotImplementedError, match=f"{feature}: "):
        integration.attention_forward(_Attention(), *_qkv(), None, **{feature: torch.zeros(1)})


def test_paged_forward_needs_continuous_batchings_cache():
    with pytest.raises(ValueError, match="cache: .*without " + re.escape("'paged|'")):
        integration.paged_attention_forward(_Attention(), *_qkv(), None)
    with pytest.raises(NotImplementedError, match="block_table: "):
        integration.paged_attention_forward(_Attention(), *_qkv(), None, cache=object(), block_table=torch.zeros(1))
    with pytest.raises(NotImplementedError, match="s_aux: "):
        integration.paged_attention_forward(_Attention(), *_qkv(), None, cache=object(), s_aux=torch.zeros(1))


def test_mask_that_is_not_the_computed_pattern_raises():
    padding = torch.ones(BATCH, 1, SEQ, SEQ, dtype=torch.bool).tril()
    padding[1, :, :, 0] = False
    with pytest.raises(NotImplementedError, match="attention_mask: .* not the causal mask"):
        integration.attention_forward(_Attention(), *_qkv(), padding)
    full = torch.ones(BATCH, 1, SEQ, SEQ, dtype=torch.bool)
    with pytest.raises(NotImplementedError, match="attention_mask: "):
        integration.attention_forward(_Attention(), *_qkv(), full)


def test_additive_bias_raises():
    bias = torch.randn(BATCH, 1, SEQ, SEQ, dtype=torch.float16)
    with pytest.raises(NotImplementedError, match="attention_mask: .*bias"):
        integration.attention_forward(_Attention(), *_qkv(), bias, is_causal=False)


def test_training_mode_raises(name):
    model = transformers.AutoModel.from_config(_bert_config(), attn_implementation=name).train()
    with pytest.raises(NotImplementedError, match="dropout: "):
        model(input_ids=_ones())


# ----------------------------------------------------------------------------------------------
# Whole models on the GPU against SDPA


def _bert_config():
    return transformers.BertConfig(
        vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024
    )


def _token_ids(config, rng: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(1, config.vocab_size, (batch, seq), generator=rng, device=rng.device)


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """A model family at a small but real size: its configuration, model class, inputs and the
    output compared."""

    config: Callable[[], object]
    model_class: Callable[[object], object]
    inputs: Callable[[object, torch.Generator], dict]
    output: str  # the attribute of the model's output compared
    reference: str = "sdpa"  # the transformers implementation that makes ref32 and ref16

    @property
    def decoder(self) -> bool:
        return self.output == "logits"

    def build(self, seed: int):
        """The model in float32 on the GPU, in eval mode, with random weights drawn from ``seed``."""
        torch.manual_seed(seed)
        return self.model_class(self.config()).cuda().eval()


def _decoder_inputs(config, rng):
    # 200 tokens: not a multiple of any tile, longer than Mistral's and Gemma 2's windows.
    return {"input_ids": _token_ids(config, rng, 2, 200)}


def _gpu_decoder(config_class, **overrides) -> Callable[[], object]:
    """A decoder configuration: 4 layers of 8 query and 2 key/value heads of size 64 unless
    ``overrides`` say otherwise."""
    options = {
        "vocab_size": 1000,
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 1024,
        "pad_token_id": 0,
    }
    return lambda: config_class(**{**options, **overrides})


MODELS = {
    "bert": ModelCase(
        _bert_config,
        transformers.BertModel,
        lambda config, rng: {"input_ids": _token_ids(config, rng, 2, 300)},
        "last_hidden_state",
    ),
    # 224 px in 16 px patches: 196 patches and the class token.
    "vit": ModelCase(
        lambda: transformers.ViTConfig(
            image_size=224,
            patch_size=16,
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            intermediate_size=1024,
        ),
        transformers.ViTModel,
        lambda config, rng: {"pixel_values": torch.randn(2, 3, 224, 224, generator=rng, device=rng.device)},
        "last_hidden_state",
    ),
    "llama_gqa_d64": ModelCase(
        _gpu_decoder(transformers.LlamaConfig), transformers.LlamaForCausalLM, _decoder_inputs, "logits"
    ),
    "llama_mqa_d128": ModelCase(
        _gpu_decoder(transformers.LlamaConfig, num_attention_heads=4, num_key_value_heads=1, head_dim=128),
        transformers.LlamaForCausalLM,
        _decoder_inputs,
        "logits",
    ),
    "mistral_sliding_window": ModelCase(
        _gpu_decoder(transformers.MistralConfig, sliding_window=64),
        transformers.MistralForCausalLM,
        _decoder_inputs,
        "logits",
    ),
    # SDPA refuses softcap, so eager is the reference; layers alternate sliding-window and full.
    "gemma2_softcap": ModelCase(
        _gpu_decoder(
            transformers.Gemma2Config,
            sliding_window=64,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            query_pre_attn_scalar=64,
        ),
        transformers.Gemma2ForCausalLM,
        _decoder_inputs,
        "logits",
        reference="eager",
    ),
}
DECODERS = [model for model, case in MODELS.items() if case.decoder]
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture
def float32_references(monkeypatch):
    """ref32 in true float32: no TF32 in matmuls or convolutions (ViT's patch embedding)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "fp32_precision", "ieee")
    monkeypatch.setattr(torch.backends.cudnn.conv, "fp32_precision", "ieee")


def _counted_calls(monkeypatch, function_name: str) -> list[int]:
    """A list that grows by one at each call of flash_attention.<function_name> from now on."""
    calls = []
    original = getattr(flash_attention, function_name)

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(flash_attention, function_name, counted)
    return calls


@pytest.fixture
def attention_calls(monkeypatch) -> list[int]:
    """Counts the calls of flash_attn_func (what the attention function runs)."""
    return _counted_calls(monkeypatch, "flash_attn_func")


@dataclasses.dataclass
class Models:
    """The same weights three ways: ref32 (float32, the reference implementation), ref16 (rounded
    once to the test dtype, the reference implementation) and ours (the ref16 weights, our
    attention implementation)."""

    ref32: object
    ref16: object
    ours: object

    @classmethod
    def of(cls, case: ModelCase, dtype: torch.dtype, seed: int, name: str) -> Models:
        ref32 = case.build(seed)
        ref32.set_attn_implementation(case.reference)
        ref16 = copy.deepcopy(ref32).to(dtype)
        ours = copy.deepcopy(ref16)
        ours.set_attn_implementation(name)
        assert ours.config._attn_implementation == name, f"{type(ours).__name__} kept its attention implementation"
        return cls(ref32, ref16, ours)

    @property
    def layers(self) -> int:
        return self.ours.config.num_hidden_layers

    def run(self, fn: Callable[[object], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ours, ref16, ref32) of ``fn(model)``, run under inference_mode."""
        with torch.inference_mode():
            return fn(self.ours), fn(self.ref16), fn(self.ref32)


def _errors(out: torch.Tensor, ref32: torch.Tensor) -> tuple[float, float]:
    """max |out - ref32| and the relative norm error ||out - ref32|| / ||ref32||."""
    error = out.double() - ref32.double()
    return error.abs().max().item(), (error.norm() / ref32.double().norm()).item()


def _assert_matches(ours: torch.Tensor, ref16: torch.Tensor, ref32: torch.Tensor, what: str) -> None:
    """FlashAttention's criterion on a whole model's output: max|ours - ref32| <= 2 * max|ref16 -
    ref32| + 1e-5, and a relative norm error below 1e-2, or below twice ref16's where the model in
    the test dtype is itself further than that from float32 (bfloat16 decoders are, about 1e-2
    whatever attention runs in them: the error is in every layer, not in attention); the factor 2
    is the max criterion's."""
    max_error, relative = _errors(ours, ref32)
    ref16_max_error, ref16_relative = _errors(ref16, ref32)
    max_allowed = 2 * ref16_max_error + 1e-5
    relative_allowed = max(MAX_RELATIVE_NORM_ERROR, 2 * ref16_relative)
    # Written so that NaN fails.
    assert max_error <= max_allowed and relative <= relative_allowed, (
        f"{what} differs from the float32 reference: max error {max_error:.3g} (allowed {max_allowed:.3g}), "
        f"relative norm error {relative:.3g} (allowed {relative_allowed:.3g})"
    )


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("model", MODELS)
def test_model_matches_reference(name, model, dtype_name, rng, seed, float32_references, attention_calls):
    case = MODELS[model]
    models = Models.of(case, DTYPES[dtype_name], seed, name)
    inputs = case.inputs(models.ours.config, rng)

    def forward(model) -> torch.Tensor:
        # The float inputs (ViT's pixels) in the model's dtype, as a pipeline would give them.
        cast = {key: value.to(model.dtype) if value.is_floating_point() else value for key, value in inputs.items()}
        return getattr(model(**cast), case.output)

    ours, ref16, ref32 = models.run(forward)
    _assert_matches(ours, ref16, ref32, f"{model} {dtype_name} {case.output}")
    assert len(attention_calls) == models.layers, "not every attention layer ran flash_attn_func"


def _cached_logits(model, chunks: list[torch.Tensor]) -> torch.Tensor:
    """The logits of feeding ``chunks`` of token ids one after the other through one DynamicCache."""
    cache = transformers.DynamicCache(config=model.config)
    return torch.cat([model(input_ids=chunk, past_key_values=cache, use_cache=True).logits for chunk in chunks], dim=1)


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("model", DECODERS)
def test_decoding_with_a_kv_cache(name, model, dtype_name, rng, seed, float32_references, attention_calls):
    """A prompt, then 3 tokens at once (queries at the bottom-right of the score matrix, which
    transformers' SDPA path runs with an explicit mask), then 3 single tokens: the same token ids
    for every model, so the logits compare step by step. The prompt is longer than the sliding
    windows, so their caches drop keys (the keys no longer start at position 0)."""
    models = Models.of(MODELS[model], DTYPES[dtype_name], seed, name)
    tokens = _token_ids(models.ours.config, rng, 2, 100 + 3 + 3)
    chunks = [tokens[:, :100], tokens[:, 100:103], *tokens[:, 103:].split(1, dim=1)]
    ours, ref16, ref32 = models.run(lambda model: _cached_logits(model, chunks))
    _assert_matches(ours, ref16, ref32, f"{model} {dtype_name} cached logits")
    assert len(attention_calls) == models.layers * len(chunks)


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_generate(name, dtype_name, rng, seed, float32_references, attention_calls):
    """Greedy generation with our attention: its logits at each new token must match the
    references' logits for the same sequence in one forward without a cache (the tokens are ours,
    so near-ties in the random model cannot make the compared sequences differ)."""
    models = Models.of(MODELS["llama_gqa_d64"], DTYPES[dtype_name], seed, name)
    prompt = _token_ids(models.ours.config, rng, 2, 50)
    new_tokens = 3
    with torch.inference_mode():
        generated = models.ours.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        ours = torch.stack(generated.logits, dim=1)
        sequence = generated.sequences[:, :-1]
        ref16, ref32 = (model(input_ids=sequence).logits[:, -new_tokens:] for model in (models.ref16, models.ref32))
    assert ours.shape[1] == new_tokens
    assert len(attention_calls) == models.layers * new_tokens
    _assert_matches(ours, ref16, ref32, f"generate {dtype_name} logits")


# ----------------------------------------------------------------------------------------------
# Batches of sequences of their own lengths on the GPU: padded and packed


def _padding_mask(lengths: list[int], left: bool) -> torch.Tensor:
    """The 2D attention_mask of a batch padded to its longest sequence, on the left or the right."""
    positions = torch.arange(max(lengths), device="cuda")
    lengths_column = torch.tensor(lengths, device="cuda")[:, None]
    used = positions >= max(lengths) - lengths_column if left else positions < lengths_column
    return used.long()


def _random_lengths(rng: torch.Generator, count: int, shortest: int, longest: int) -> list[int]:
    return torch.randint(shortest, longest + 1, (count,), generator=rng, device=rng.device).tolist()


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_padded_bert_batch_matches_sdpa(name, dtype_name, rng, seed, float32_references):
    """A right-padded batch of random lengths: the hidden states of the tokens (not of the padding,
    which no one reads) against the same weights on SDPA."""
    models = Models.of(MODELS["bert"], DTYPES[dtype_name], seed, name)
    lengths = _random_lengths(rng, 5, 20, 300)
    attention_mask = _padding_mask(lengths, left=False)
    input_ids = _token_ids(models.ours.config, rng, len(lengths), max(lengths)) * attention_mask
    ours, ref16, ref32 = models.run(
        lambda model: model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    )
    tokens = attention_mask.bool()
    _assert_matches(ours[tokens], ref16[tokens], ref32[tokens], f"padded bert {dtype_name} hidden states")


def _decisive(case: ModelCase) -> ModelCase:
    """``case`` with its output layer scaled up, so that the model's greedy choices are far apart
    more often than random weights make them."""

    def build(config):
        model = case.model_class(config)
        with torch.no_grad():
            model.lm_head.weight.mul_(20.0)
        return model

    return dataclasses.replace(case, model_class=build)


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
def test_left_padded_generate_matches_sdpa(name, dtype_name, rng, seed, float32_references):
    """Batched greedy generation from left-padded prompts of their own lengths (the prompt as a
    padded batch, then decoding against a cache that starts with the padding): the same tokens as
    SDPA's generate(), unless the float32 model itself can hardly tell the two choices apart (their
    logits closer than the criterion's bound), and at every step logits that match the references'
    on the same sequence in one forward without a cache."""
    models = Models.of(_decisive(MODELS["llama_gqa_d64"]), DTYPES[dtype_name], seed, name)
    lengths = _random_lengths(rng, 4, 5, 60)
    attention_mask = _padding_mask(lengths, left=True)
    prompt = _token_ids(models.ours.config, rng, len(lengths), max(lengths)) * attention_mask
    new_tokens = 6
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, return_dict_in_generate=True)
    with torch.inference_mode():
        ours = models.ours.generate(prompt, attention_mask=attention_mask, output_logits=True, **options)
        sdpa = models.ref16.generate(prompt, attention_mask=attention_mask, **options)
        sequence = ours.sequences[:, :-1]
        full_mask = torch.cat([attention_mask, attention_mask.new_ones(len(lengths), new_tokens - 1)], dim=1)
        # generate's positions: counted from each sequence's first token.
        position_ids = (full_mask.cumsum(-1) - 1).clamp(min=0)
        inputs = dict(input_ids=sequence, attention_mask=full_mask, position_ids=position_ids)
        ref16, ref32 = (model(**inputs).logits[:, -new_tokens:].float() for model in (models.ref16, models.ref32))
    _assert_matches(torch.stack(ours.logits, dim=1).float(), ref16, ref32, f"left-padded generate {dtype_name} logits")
    generated, expected = ours.sequences[:, -new_tokens:], sdpa.sequences[:, -new_tokens:]
    for row in range(len(lengths)):
        differing = (generated[row] != expected[row]).nonzero()
        if len(differing):
            step = differing[0].item()  # the sequences part there: compare no further
            bound = 2 * (ref16[row, step] - ref32[row, step]).abs().max().item() + 1e-5
            chosen = ref32[row, step, generated[row, step]].item()
            assert chosen >= ref32[row, step].max().item() - bound, (
                f"sequence {row} of lengths {lengths}: token {step} differs from SDPA's, and the float32 model "
                "prefers SDPA's by more than the criterion allows"
            )


def _flattened(lengths: list[int], config, rng: torch.Generator, flash_kwargs: bool) -> tuple[list, dict]:
    """Sequences of ``lengths`` random tokens, and their padding-free batch as
    DataCollatorWithFlattening makes it (one row, position_ids restarting at each sequence; with
    ``flash_kwargs`` also cu_seq_lens_q/k and max_length_q/k), on the GPU."""
    sequences = [_token_ids(config, rng, 1, length)[0] for length in lengths]
    collator = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs, return_tensors="pt")
    batch = collator([{"input_ids": sequence.tolist()} for sequence in sequences])
    batch.pop("labels", None)
    return sequences, {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


@gpu
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("flash_kwargs", [False, True], ids=["position_ids", "cu_seq_lens"])
def test_packed_batch_matches_each_sequence_alone(name, dtype_name, flash_kwargs, rng, seed, float32_references):
    """A padding-free batch (DataCollatorWithFlattening: several sequences in one row, told apart by
    position_ids that restart, or by the cu_seq_lens keywords too): our logits of the packed row
    against the references' logits of each sequence run alone."""
    models = Models.of(MODELS["llama_gqa_d64"], DTYPES[dtype_name], seed, name)
    lengths = _random_lengths(rng, 5, 1, 200)
    sequences, packed = _flattened(lengths, models.ours.config, rng, flash_kwargs)
    with torch.inference_mode():
        # Without a cache: transformers looks for packed sequences in position_ids only then.
        ours = models.ours(**packed, use_cache=False).logits[0]
        ref16, ref32 = (
            torch.cat([model(input_ids=sequence[None]).logits[0] for sequence in sequences])
            for model in (models.ref16, models.ref32)
        )
    told_apart_by = "cu_seq_lens" if flash_kwargs else "position_ids"
    _assert_matches(ours, ref16, ref32, f"packed batch {dtype_name} logits ({told_apart_by})")


# ----------------------------------------------------------------------------------------------
# Continuous batching on the GPU: requests of their own lengths against transformers' paged cache


@gpu
@pytest.mark.parametrize("cuda_graphs", [False, True], ids=["eager", "cuda_graphs"])
@pytest.mark.parametrize("dtype_name", DTYPES)
@pytest.mark.parametrize("model", ["llama_gqa_d64", "gemma2_softcap"])
def test_continuous_batching_matches_the_reference(
    name, model, dtype_name, cuda_graphs, rng, seed, float32_references, monkeypatch
):
    """generate_batch (continuous batching: prompts of their own lengths prefilled in chunks of at
    most max_batch_tokens, then decoded together, against transformers' paged cache) on "paged|" +
    name: the same greedy tokens as the reference's paged implementation ("paged|sdpa", or
    "paged|eager" for Gemma 2, whose sliding and full layers get keys by layer type), unless the
    float32 model itself can hardly tell the two choices apart (their logits closer than the
    criterion's bound), with every layer of every forward through flash_attn_varlen_func."""
    calls = _counted_calls(monkeypatch, "flash_attn_varlen_func")
    case = MODELS[model]
    models = Models.of(_decisive(case), DTYPES[dtype_name], seed, name)
    models.ours.set_attn_implementation(f"paged|{name}")
    reference = copy.deepcopy(models.ref16)
    reference.set_attn_implementation(f"paged|{case.reference}")
    lengths = _random_lengths(rng, 6, 1, 300)
    prompts = [_token_ids(models.ours.config, rng, 1, length)[0].tolist() for length in lengths]
    new_tokens = 8
    generation = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1)
    batching = transformers.ContinuousBatchingConfig(
        block_size=32, num_blocks=64, max_batch_tokens=128, use_cuda_graph=cuda_graphs
    )

    def generated(model) -> list[list[int]]:
        outputs = model.generate_batch(prompts, generation_config=generation, continuous_batching_config=batching)
        by_request = list(outputs.values())  # in the order of the prompts
        assert [output.error for output in by_request] == [None] * len(prompts)
        assert [output.prompt_ids for output in by_request] == prompts
        return [output.generated_tokens for output in by_request]

    ours, expected = generated(models.ours), generated(reference)
    assert calls and len(calls) % models.layers == 0, f"{len(calls)} attention calls for {models.layers} layers"
    for row, (tokens, reference_tokens) in enumerate(zip(ours, expected)):
        assert len(tokens) == new_tokens
        differing = [step for step, (a, b) in enumerate(zip(tokens, reference_tokens)) if a != b]
        if not differing:
            continue
        step = differing[0]  # the sequences part there: compare no further
        sequence = torch.tensor([prompts[row] + tokens[:step]], device="cuda")
        with torch.inference_mode():
            ref16, ref32 = (model(input_ids=sequence).logits[0, -1].float() for model in (models.ref16, models.ref32))
        bound = 2 * (ref16 - ref32).abs().max().item() + 1e-5
        assert ref32[tokens[step]].item() >= ref32.max().item() - bound, (
            f"request {row} of lengths {lengths}: token {step} differs from the reference's, and the float32 "
            "model prefers the reference's by more than the criterion allows"
        )
