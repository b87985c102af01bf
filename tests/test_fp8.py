"""FP8 inputs: float8_e4m3fn q, k and v with FlashAttention-3's descales (float32, (batch,
heads_kv)) and a 16-bit output, on the Hopper family's E4M3 configurations (sm_90 only; dense,
varlen and paged calls, forward only).

The criterion (flash_helpers.reference, Fp8Reference): the kernel quantises P to e4m3 (3 mantissa
bits) before P V, with P scaled so that a row's largest probability is 2^8 (P in [0, 256]). So the
output is compared with attention in float32 on the dequantised inputs (ref32), with a tolerance
derived from an emulation: a second float32 reference that rounds P * 256 to e4m3 (P = exp(s - the
row's true maximum)) before P V, normalised by the unrounded row sum, its output rounded to the
output dtype. We require max|ours - ref32| <= 2 * max|emulation - ref32| + 2e-3: our error may
exceed the emulation's because the kernel quantises P against the running row maximum and rescales
as the maximum grows, and because its output is rounded once more (the emulation's error is taken
to be at least half a unit in the last place of the largest output element, as in the 16-bit
criterion). lse must be within 1e-3 + 2^-10 (1 + E_i) of ref32's, E_i the softmax-weighted
magnitude of the row's scores (the float32 criterion allows 2^-13 (1 + E_i)): the 8-bit products'
sums in the tensor cores keep fewer bits than float32's (rows measured off by up to about
2^-12 (1 + E_i) on the H200).

Every call writes into a NaN-poisoned o and is repeated bitwise identically (helpers.check_forward).
GPU tests carry the ``gpu`` marker and skip, with the reason, without a GPU, a build or an sm_90 GPU
with E4M3 configurations; the tests of the reference need only torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402
from flash_helpers.dtypes import DType  # noqa: E402
from flash_helpers.reference import Fp8Reference, attention, dequantize, half_ulp, reference_for_call  # noqa: E402
from flash_helpers.sm90_config import HopperForwardKernelConfig  # noqa: E402
from helpers import Problem, check_forward  # noqa: E402

BUILT = helpers.extension_is_built()
if BUILT:
    import flash_attention

gpu = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn
NO_E4M3_CONFIG = (
    "no e4m3 configuration under test: a default build has them, and they run on sm_90 GPUs (H100, H200) only"
)


def e4m3_configs() -> list:
    return [cfg for cfg in helpers.configs_under_test(fp8=True) if cfg.dtype == DType.E4M3] if BUILT else []


CONFIGS = e4m3_configs()


def fp8_cases(argnames: str, cases: list[tuple], describe):
    return helpers.gpu_cases(argnames, cases, describe, NO_E4M3_CONFIG)


# ----------------------------------------------------------------------------------------------
# Inputs


def descales(kind: str, batch: int, heads_kv: int, rng) -> dict:
    """The call's descale keywords of one kind: none (factors of 1), ones (given, all 1, an
    expanded scalar: strides 0), per_head (random in [0.5, 2], a factor of its own per (batch, kv
    head)) or transposed (as per_head, stored (heads_kv, batch): other strides)."""
    if kind == "none":
        return {}
    if kind == "ones":
        one = torch.ones((), device="cuda")
        return {name: one.expand(batch, heads_kv) for name in ("q_descale", "k_descale", "v_descale")}
    factors = {}
    for name in ("q_descale", "k_descale", "v_descale"):
        if kind == "per_head":
            factors[name] = torch.rand((batch, heads_kv), generator=rng, device="cuda") * 1.5 + 0.5
        else:
            factors[name] = (torch.rand((heads_kv, batch), generator=rng, device="cuda") * 1.5 + 0.5).t()
    return factors


DESCALE_KINDS = ("none", "ones", "per_head", "transposed")
OUT_DTYPES = {"bf16": None, "fp16": torch.float16, "bf16_named": torch.bfloat16}


def fp8_inputs(cfg, problem: Problem, descale_kind: str, out_dtype, rng) -> helpers.Inputs:
    """Fresh random e4m3 inputs of ``problem`` (torch.randn rounded to e4m3), with descales of
    ``descale_kind`` and out_dtype (None: the default, bfloat16)."""
    inputs = problem.make(cfg, rng)
    assert inputs.q.dtype == E4M3
    inputs.kwargs.update(descales(descale_kind, problem.batch, problem.heads_kv, rng))
    if out_dtype is not None:
        inputs.kwargs["out_dtype"] = out_dtype
    return inputs


# ----------------------------------------------------------------------------------------------
# Every e4m3 configuration: lengths, masks, score modifications, grouped heads, descales, output dtypes

LENGTHS = [(1, 1), (1, 1000), (17, 255), (255, 17), (128, 128), (255, 1000), (1000, 1000)]
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "local": {"window_size": (100, 7)},
    "softcap": {"softcap": 30.0},
    "alibi": {"alibi": "per_batch_head"},
    "causal_softcap_alibi": {"causal": True, "softcap": 30.0, "alibi": "per_head"},
}
HEADS = [(8, 2), (4, 4)]


def matrix_cases() -> list[tuple]:
    """The matrix's cases whose problem variant the configuration is compiled for: a configuration
    outside the default set is built with the benchmarks' variants alone (a default build has every
    variant of every e4m3 configuration but d_head 256's dense-only block's varlen ones)."""
    cases = [
        (cfg, problem, mask, descale_kind, out_name)
        for cfg, (seqlen_q, seqlen_k), mask, (heads_q, heads_kv), descale_kind, out_name in itertools.product(
            CONFIGS, LENGTHS, MASKS, HEADS, DESCALE_KINDS, OUT_DTYPES
        )
        for problem in [Problem(seqlen_q, seqlen_k, heads_q, heads_kv, **MASKS[mask])]
        if problem.variant(cfg) in flash_attention.compiled_variants(cfg)
    ]
    axes = lambda case: (case[0], (case[1].seqlen_q, case[1].seqlen_k), case[2], case[1].heads_q, case[3], case[4])  # noqa: E731
    return helpers.covering_sample(cases, axes, "fp8")


@gpu
@fp8_cases(
    "cfg, problem, mask, descale_kind, out_name",
    matrix_cases(),
    lambda cfg, problem, mask, descale_kind, out_name: f"{cfg.short_form()}-{problem.describe()}-{descale_kind}-{out_name}",
)
def test_every_e4m3_configuration(cfg, problem, mask, descale_kind, out_name, rng):
    del mask  # in the problem (and the id)
    inputs = fp8_inputs(cfg, problem, descale_kind, OUT_DTYPES[out_name], rng)
    out, _ = check_forward(cfg, inputs)
    assert out.dtype == (OUT_DTYPES[out_name] or torch.bfloat16)


# ----------------------------------------------------------------------------------------------
# The automatic choice and the entry points

AUTOMATIC = [
    # (d_head, problem keywords): the default set's head sizes, and sizes served by a larger one (96
    # reads 128 with zero columns past it; 72 runs on copies padded to 80, a multiple of 16 bytes).
    (64, dict(seqlen_q=300, seqlen_k=300, causal=True)),
    (128, dict(seqlen_q=1, seqlen_k=777, heads_q=8, heads_kv=2)),
    (128, dict(seqlen_q=513, seqlen_k=200, window_size=(50, 50))),
    (256, dict(seqlen_q=130, seqlen_k=257, softcap=30.0)),
    (96, dict(seqlen_q=200, seqlen_k=200)),
    (72, dict(seqlen_q=150, seqlen_k=99, causal=True)),
]


def _automatic_cases() -> list[tuple]:
    served = {cfg.d_head for cfg in CONFIGS}
    return [(d_head, call) for d_head, call in AUTOMATIC if any(d >= d_head for d in served)] if CONFIGS else []


@gpu
@fp8_cases("d_head, call", _automatic_cases(), lambda d_head, call: f"d{d_head}-{Problem(**call).describe()}")
def test_flash_attn_func_chooses_an_e4m3_configuration(d_head, call, rng):
    problem = Problem(**call)
    # Problem.make reads a configuration's dtype and d_head: these inputs' are (an e4m3 head size or not).
    shape = HopperForwardKernelConfig(DType.E4M3, d_head, 128, 128, 2)
    inputs = fp8_inputs(shape, problem, "per_head", None, rng)
    out, lse, _ = flash_attention.flash_attn_func(inputs.q, inputs.k, inputs.v, return_attn_probs=True, **inputs.kwargs)
    assert out.dtype == torch.bfloat16 and out.shape == inputs.q.shape
    reference = inputs.reference()
    assert reference.compare(out).passed, reference.compare(out).describe()
    helpers.assert_lse_matches(lse, reference)
    problem_keywords = ("causal", "window_size", "softcap", "alibi_slopes")
    choice = flash_attention.choose_config(
        inputs.q, inputs.k, **{key: value for key, value in inputs.kwargs.items() if key in problem_keywords}
    )
    assert choice.config.dtype == DType.E4M3 and choice.config.family == "sm90" and choice.config.d_head >= d_head
    assert "E4M3" in choice.reason
    named = flash_attention.forward(choice.config, inputs.q, inputs.k, inputs.v, **inputs.kwargs)
    assert torch.equal(named, out), "flash_attn_func is not forward with the chosen configuration"


@gpu
@fp8_cases("cfg", [(cfg,) for cfg in CONFIGS[:1]], lambda cfg: cfg.short_form())
def test_the_operators_take_fp8_arguments(cfg, rng):
    """Through the torch operators (under a torch-function mode), opcheck's fake-tensor check (the
    fake kernel's output dtype; its other checks compute on the inputs, which torch does not for
    float8), and torch.compile without graph breaks."""
    inputs = fp8_inputs(cfg, Problem(150, 170, 8, 2, causal=True), "per_head", torch.float16, rng)
    q, k, v, keywords = inputs.q, inputs.k, inputs.v, inputs.kwargs
    eager = flash_attention.forward(cfg, q, k, v, **keywords)
    with torch.device("cuda"):
        assert torch.equal(flash_attention.forward(cfg, q, k, v, **keywords), eager)
        o = torch.empty_like(q, dtype=torch.float16)
        flash_attention.forward(cfg, q, k, v, o, **keywords)
        assert torch.equal(o, eager)
    fp8 = {name: keywords[name] for name in ("q_descale", "k_descale", "v_descale", "out_dtype")}
    args = (q, k, v, cfg.short_form(), True, None, [-1, 0], 0.0, None, True)
    fake = ("test_faketensor",)
    torch.library.opcheck(torch.ops.flash_attention.forward.default, args, fp8, test_utils=fake)
    torch.library.opcheck(torch.ops.flash_attention.forward_out.default, (*args, torch.empty_like(o)), fp8, test_utils=fake)

    torch._dynamo.reset()

    def fn(q, k, v, q_descale, k_descale, v_descale):
        return flash_attention.flash_attn_func(
            q, k, v, causal=True, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale
        )

    descale_values = [keywords[name] for name in ("q_descale", "k_descale", "v_descale")]
    explanation = torch._dynamo.explain(fn)(q, k, v, *descale_values)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(fn, fullgraph=True)
    with torch.inference_mode():
        result = compiled(q, k, v, *descale_values)
        assert result.dtype == torch.bfloat16 and torch.equal(result, fn(q, k, v, *descale_values))


def _copy_twins() -> list:
    """The V_transposed_copy configurations under test whose transposing twin (the same block without
    it) is under test too."""
    return [
        cfg for cfg in CONFIGS
        if cfg.V_transposed_copy and dataclasses.replace(cfg, V_transposed_copy=False) in CONFIGS
    ]  # fmt: skip


@gpu
@fp8_cases("cfg", [(cfg,) for cfg in _copy_twins()], lambda cfg: cfg.short_form())
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("head_cut", [0, 32], ids=["its-head", "a-smaller-head"])
def test_V_transposed_copy_matches_its_transposing_twin_bit_for_bit(cfg, causal, head_cut, rng):
    """A vtcopy block's P V operand is the transposing block's tile, written by the copy kernel rather than
    by the transposing warps, so the two give the same bits: on a V that is a strided view (every other
    key/value head of a wider tensor) with 1000 keys (a partial 16-key group and a partial tile) and
    descales per head; at the block's head size, and at one 32 smaller (the copy's rows end at the call's)."""
    twin = dataclasses.replace(cfg, V_transposed_copy=False)
    batch, heads_q, heads_kv, d_head = 2, 8, 2, cfg.d_head - head_cut
    q = helpers.random_tensor((batch, 700, heads_q, d_head), E4M3, rng)
    k = helpers.random_tensor((batch, 1000, heads_kv, d_head), E4M3, rng)
    v = helpers.random_tensor((batch, 1000, 2 * heads_kv, d_head), E4M3, rng)[:, :, ::2]
    keywords = dict(causal=causal, **descales("per_head", batch, heads_kv, rng))
    copied = flash_attention.forward(cfg, q, k, v, **keywords)
    transposed = flash_attention.forward(twin, q, k, v, **keywords)
    assert torch.equal(copied, transposed)
    helpers.assert_matches_reference(copied, q, k, v, **keywords)


# ----------------------------------------------------------------------------------------------
# What e4m3 inputs do not run, and bad arguments: each raises before anything runs, naming the
# argument


def _tensors(rng, batch=2, seqlen=64, heads=(4, 2), d_head=128, dtype=E4M3):
    q = helpers.random_tensor((batch, seqlen, heads[0], d_head), dtype, rng)
    k, v = (helpers.random_tensor((batch, seqlen, heads[1], d_head), dtype, rng) for _ in range(2))
    return q, k, v


@gpu
@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
@pytest.mark.parametrize("operators", [False, True], ids=["eager", "operators"])
def test_bad_fp8_arguments_are_named(rng, operators):
    q, k, v = _tensors(rng)
    half = [t.float().half() for t in (q, k, v)]
    factors = torch.ones(2, 2, device="cuda")
    cases = [
        # (call's arguments, exception, message)
        ((q, half[1], v), {}, TypeError, "k: dtype Half differs from q's Float8_e4m3fn"),
        ((q, k, half[2]), {}, TypeError, "v: dtype Half differs from q's Float8_e4m3fn"),
        # 16-bit q with e4m3 k and v is an FP8 cache (tests/test_fp8_kvcache.py); with one of them alone, not.
        ((half[0], k, half[2]), {}, TypeError, "v: dtype float16; an FP8 cache has float8_e4m3fn keys and values both"),
        ((q, k, v), {"q_descale": factors.half()}, TypeError, "q_descale: dtype must be float32, got Half"),
        ((q, k, v), {"k_descale": torch.ones(2, 4, device="cuda")}, ValueError, r"k_descale: shape \[2, 4\] must be \(batch, heads_kv\) = \(2, 2\)"),
        ((q, k, v), {"v_descale": torch.ones(2, device="cuda")}, ValueError, r"v_descale: shape \[2\] must be \(batch, heads_kv\)"),
        ((q, k, v), {"q_descale": torch.ones(2, 2)}, ValueError, "q_descale: is on cpu but q is on cuda"),
        (tuple(half), {"v_descale": factors}, ValueError, "v_descale: descales apply to float8_e4m3fn inputs only; v is float16"),
        ((q, k, v), {"out_dtype": torch.float32}, ValueError, "out_dtype: must be float16 or bfloat16 for float8_e4m3fn inputs, got float32"),
        (tuple(half), {"out_dtype": torch.bfloat16}, ValueError, "out_dtype: chooses the output's dtype of float8_e4m3fn inputs only"),
        ((q, k, v), {"out_dtype": "bf16"}, TypeError, "out_dtype: expected a torch.dtype"),
        ((q, k, v), {"k_descale": 1.0}, TypeError, "k_descale: expected a torch.Tensor"),
        ((q, k, v), {"o": torch.empty_like(q, dtype=torch.float16)}, TypeError, r"o: dtype Half is not the output's bfloat16 \(float8_e4m3fn inputs write"),
        ((q, k, v), {"o": torch.empty_like(q, dtype=torch.bfloat16), "out_dtype": torch.float16}, TypeError, "o: dtype BFloat16 is not the output's float16"),
        ((q, k, v), {"o": torch.empty_like(q)}, TypeError, "o: dtype Float8_e4m3fn is not the output's bfloat16"),
    ]
    for tensors, keywords, error, message in cases:
        keywords = dict(keywords)
        o = keywords.pop("o", None)
        with pytest.raises(error, match=message):
            if operators:
                with torch.device("cuda"):  # a torch-function mode: the call goes through the operators
                    flash_attention.forward(None, *tensors, o, **keywords)
            else:
                flash_attention.forward(None, *tensors, o, **keywords)


def _varlen_configs() -> list:
    """The e4m3 configurations under test with their varlen variants."""
    return [cfg for cfg in CONFIGS if any(v.varlen for v in flash_attention.compiled_variants(cfg))] if BUILT else []


@gpu
@fp8_cases("cfg", [(cfg,) for cfg in _varlen_configs()], lambda cfg: cfg.short_form())
@pytest.mark.parametrize("mask", ["none", "causal", "local"])
def test_fp8_varlen_calls_match_the_reference(cfg, mask, rng):
    """A packed batch (an empty sequence, partial blocks, more keys than queries and fewer) with a
    descale per (sequence, kv head), then the same keys on pages of 64 rows in random order: each
    against the per-sequence FP8 reference, into a poisoned o, repeated bit for bit; the automatic
    choice (flash_attn_varlen_func) and flash_attn_with_kvcache (attending an e4m3 cache with
    q_descale) too."""
    keywords = {"none": {}, "causal": dict(causal=True), "local": dict(window_size=(70, 5))}[mask]
    heads, lengths_q, lengths_k = (4, 2), [0, 77, 130, 5], [33, 190, 64, 300]
    cu_q, cu_k = ([0, *itertools.accumulate(n)] for n in (lengths_q, lengths_k))
    q, k, v = (
        helpers.random_tensor((cu[-1], h, cfg.d_head), E4M3, rng)
        for cu, h in ((cu_q, heads[0]), (cu_k, heads[1]), (cu_k, heads[1]))
    )
    factors = descales("per_head", len(lengths_q), heads[1], rng)
    sequences = dict(
        cu_seqlens_q=torch.tensor(cu_q, dtype=torch.int32, device="cuda"),
        cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32, device="cuda"),
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
    )
    inputs = helpers.Inputs(q, k, v, {**sequences, **factors, **keywords})
    out, lse = check_forward(cfg, inputs)
    automatic = flash_attention.flash_attn_varlen_func(q, k, v, **sequences, **factors, **keywords)
    helpers.assert_matches_reference(automatic, q, k, v, **sequences, **factors, **keywords)

    paged = helpers.PagedCache.of(
        [k[a:b].view(torch.uint8) for a, b in zip(cu_k, cu_k[1:])],
        [v[a:b].view(torch.uint8) for a, b in zip(cu_k, cu_k[1:])],
        64,
        rng,
    )
    pool_k, pool_v = paged.k.view(E4M3), paged.v.view(E4M3)
    paged_out = flash_attention.forward(
        cfg, q, pool_k, pool_v, helpers.nan_like(out), block_table=paged.block_table, **sequences, **factors, **keywords
    )
    assert torch.equal(paged_out, out), "the paged keys give other bits than the packed ones"

    # A decode step against a dense e4m3 cache: one query per sequence, its lengths in cache_seqlens.
    cache_k, cache_v = (helpers.random_tensor((4, 300, heads[1], cfg.d_head), E4M3, rng) for _ in range(2))
    step_q = helpers.random_tensor((4, 1, heads[0], cfg.d_head), E4M3, rng)
    seqlens = torch.tensor(lengths_k, dtype=torch.int32, device="cuda")
    step = flash_attention.flash_attn_with_kvcache(step_q, cache_k, cache_v, cache_seqlens=seqlens, **factors, **keywords)
    helpers.assert_matches_reference(step, step_q, cache_k, cache_v, seqused_k=seqlens, **factors, **keywords)


@gpu
@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_fp8_calls_that_do_not_run_say_so(rng):
    q, k, v = _tensors(rng)
    # Appending to an e4m3 cache is for 16-bit queries, which it quantises: e4m3 ones are a bad type there.
    with pytest.raises(TypeError, match="q: a float8_e4m3fn cache takes float16 or bfloat16 queries"):
        flash_attention.flash_attn_with_kvcache(q[:, :1], k, v, k[:, :1], v[:, :1], cache_seqlens=5)
    with pytest.raises(NotImplementedError, match="query: float8_e4m3fn inputs are not supported here"):
        flash_attention.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    for cfg in CONFIGS[:1]:
        with pytest.raises(ValueError, match="^num_splits: .* does not split the keys"):
            flash_attention.forward(cfg, q[..., : cfg.d_head], k[..., : cfg.d_head], v[..., : cfg.d_head], num_splits=3)


@gpu
@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_fp8_is_forward_only(rng):
    q, k, v = _tensors(rng)
    factors = torch.ones(2, 2, device="cuda", requires_grad=True)
    for call in (
        lambda: flash_attention.flash_attn_func(q.clone().requires_grad_(), k, v),
        lambda: flash_attention.flash_attn_func(q, k, v, v_descale=factors),
    ):
        with pytest.raises(NotImplementedError, match="no backward pass"):
            call()
        with pytest.raises(NotImplementedError, match="no backward pass"), torch.device("cuda"):
            call()
    with torch.no_grad(), pytest.raises(ValueError, match="q_descale: shape"):
        # Past the grad check, to the call's own: nothing is detached silently.
        flash_attention.flash_attn_func(q.clone().requires_grad_(), k, v, q_descale=factors[:1])


@gpu
@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_fp8_needs_an_e4m3_configuration(rng):
    q, k, v = _tensors(rng)
    sm80 = "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax"
    with pytest.raises((TypeError, ValueError), match="float8_e4m3fn inputs run on the Hopper family's E4M3|not compiled"):
        flash_attention.forward(sm80, q, k, v)
    # No kernel runs e4m3 inputs off sm_90: the automatic choice says why (meta tensors, an arch name).
    meta = [torch.empty(t.shape, dtype=E4M3, device="meta") for t in (q, k)]
    with pytest.raises(ValueError, match="runs float8_e4m3fn attention with d_head 128 .* on sm_80"):
        flash_attention.choose_config(*meta, arch="sm_80")


@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_e4m3_sm80_configurations_are_invalid():
    with pytest.raises(ValueError, match="the SM80 family runs 16-bit inputs"):
        flash_attention.forward("(E4M3, 128, 128, 64, 4)", *(torch.empty(1, 8, 1, 128) for _ in range(3)))


# ----------------------------------------------------------------------------------------------
# The reference itself (torch only)


def _cpu_inputs(seed, batch=2, seqlen_q=37, seqlen_k=300, heads=(8, 2), d_head=64):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn((batch, seqlen_q, heads[0], d_head), generator=generator).to(E4M3)
    k, v = (torch.randn((batch, seqlen_k, heads[1], d_head), generator=generator).to(E4M3) for _ in range(2))
    factors = [torch.rand((batch, heads[1]), generator=generator) * 1.5 + 0.5 for _ in range(3)]
    return q, k, v, dict(zip(("q_descale", "k_descale", "v_descale"), factors))


def test_dequantize_gives_each_query_head_its_kv_heads_factor(seed):
    q, _, _, factors = _cpu_inputs(seed)
    values = dequantize(q, factors["q_descale"])
    for head in range(8):
        expected = q[:, :, head].float() * factors["q_descale"][:, head // 4, None, None]
        assert torch.equal(values[:, :, head], expected)
    assert torch.equal(dequantize(q, None), q.float())


def test_fp8_reference_is_attention_on_the_dequantised_inputs(seed):
    q, k, v, factors = _cpu_inputs(seed)
    reference = reference_for_call(q, k, v, causal=True, **factors)
    assert isinstance(reference, Fp8Reference)
    dequantised = [dequantize(t, factors[f"{name}_descale"]) for name, t in zip("qkv", (q, k, v))]
    out, lse = attention(*dequantised, torch.float32, return_lse=True, causal=True)
    assert torch.equal(reference.ref32, out) and torch.equal(reference.lse, lse)


def test_fp8_criterion_is_set_by_the_emulation(seed):
    q, k, v, factors = _cpu_inputs(seed)
    reference = Fp8Reference(q, k, v, **factors, out_dtype=torch.float16)
    # Quantising P costs far more than float32 rounding, and the output is float16.
    assert 1e-3 < reference.ref16_max_error < 0.1
    assert reference.rounding_floor == half_ulp(reference.ref32.abs().max().item(), torch.float16)
    assert reference.compare(reference.ref32.half()).passed
    comparison = reference.compare(reference.ref32 + 2.5 * reference.ref16_max_error + 2e-3)
    assert not comparison.passed and comparison.max_relative_norm_error is None
    assert not reference.compare(torch.full_like(reference.ref32, math.nan)).passed
    assert reference.compare_lse(reference.lse + 1e-3).passed
    assert not reference.compare_lse(reference.lse + 0.1).passed


def test_the_16_bit_reference_refuses_fp8_inputs(seed):
    from flash_helpers.reference import FloatReference

    q, k, v, _ = _cpu_inputs(seed)
    with pytest.raises(TypeError, match="Fp8Reference"):
        FloatReference(q, k, v)
