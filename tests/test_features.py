"""The feature suite, in the spirit of FlashAttention-2's tests/test_flash_attn.py forward tests:
many (seqlen_q, seqlen_k) pairs (1, odd, primes, equal, longer and shorter), every compiled head
size and dtype, causal and local masks (windows that bound one side, both, neither, or miss the
keys), softcap, ALiBi (per head and per batch and head), grouped heads (GQA and MQA), softmax
scales, rows that attend no key, seqlen_k = 0, strided views, and every compiled kernel. Each call
writes into a NaN-poisoned o, is compared with the float32 reference (output and lse) and repeated
bitwise identically.

Features need the problem variants they use: they are swept on the configurations compiled with
every variant (the default build's); whole-block causal and unmasked problems run on every
compiled configuration. KERNELS (short forms separated by ';', or a set name) restricts the
configurations, as in test_forward.py.

By default each matrix is a deterministic sample (every pair of values of any two axes appears, and
every (configuration, lengths, mask) triple of the main matrix), a few minutes on one H200:

    python3 -m pytest -n 8 tests/test_features.py

The whole matrix (about 4,500 calls per configuration in the main test):

    FLASH_TEST_FULL=1 python3 -m pytest -n 8 tests/test_features.py

GPU tests carry the ``gpu`` marker and skip, with the reason, without a GPU or a build; the tests of
the reference itself at the end need only torch.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402
from flash_helpers import reference as reference_module  # noqa: E402
from flash_helpers.problem import ALL_VARIANTS, MaskKind, ProblemVariant  # noqa: E402
from flash_helpers.reference import FloatReference  # noqa: E402
from helpers import Problem, check_forward  # noqa: E402

BUILT = helpers.extension_is_built()
if BUILT:
    import flash_attention

CONFIGS = helpers.configs_under_test() if BUILT else []
# The configurations every feature can run on.
FEATURE_CONFIGS = helpers.configs_with(CONFIGS, *ALL_VARIANTS) if BUILT else []
NO_FEATURE_CONFIG = "no configuration under test is compiled with every problem variant (a default build has them)"

gpu = pytest.mark.gpu


def gpu_cases(argnames: str, cases: list[tuple], describe, empty_reason: str = NO_FEATURE_CONFIG):
    """helpers.gpu_cases, where no configuration is compiled with every problem variant by default."""
    return helpers.gpu_cases(argnames, cases, describe, empty_reason)


def config_and_problem_id(cfg, problem: Problem) -> str:
    return f"{cfg.short_form()}-{problem.describe()}"


# ----------------------------------------------------------------------------------------------
# The main matrix: lengths x masks x score modifications x heads, on every feature configuration

SEQLENS = [
    (1, 1),
    (1, 239),
    (3, 799),
    (127, 512),
    (113, 203),
    (128, 217),
    (113, 211),
    (108, 256),
    (256, 512),
    (512, 256),
    (1024, 1024),
    (1023, 1024),
    (1024, 1023),
    (2048, 2048),
    (197, 197),
]
# name: (causal, window_size)
MASKS = {
    "no_mask": (False, (-1, -1)),
    "causal": (True, (-1, -1)),
    "causal_as_window": (False, (-1, 0)),
    "diagonal_only": (False, (0, 0)),
    "window_3_17": (False, (3, 17)),
    "left_128": (False, (128, -1)),
    "right_64": (False, (-1, 64)),
    "causal_left_48": (True, (48, 5)),  # causal sets right to 0: the 5 is ignored
    "window_wider_than_seq": (False, (4096, 4096)),  # bounds nothing: no mask
    "causal_left_wider_than_seq": (False, (4096, 0)),  # causal
}
HEADS = [(8, 8), (8, 4), (8, 2), (8, 1), (6, 2), (6, 3)]  # (heads_q, heads_kv): MHA, GQA, MQA


def main_matrix() -> list[tuple]:
    axes = list(itertools.product(FEATURE_CONFIGS, SEQLENS, MASKS, helpers.SCORE_MODS, HEADS))
    # Every (configuration, lengths, mask) triple: the tails and the mask meet in every block shape.
    sample = helpers.covering_sample(axes, lambda case: case, "main", extra_groups=[(0, 1, 2)])
    cases = []
    for cfg, (seqlen_q, seqlen_k), mask, mods, (heads_q, heads_kv) in sample:
        causal, window_size = MASKS[mask]
        softcap, alibi = helpers.SCORE_MODS[mods]
        problem = Problem(seqlen_q, seqlen_k, heads_q, heads_kv, 2, causal, window_size, softcap, alibi)
        cases.append((cfg, problem))
    return cases


@gpu
@gpu_cases("cfg, problem", main_matrix(), config_and_problem_id)
def test_matches_reference(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


# ----------------------------------------------------------------------------------------------
# Focused tests


def softmax_scale_cases() -> list[tuple]:
    scales = [1e-3, 0.05, 0.5, 2.0]
    shapes = {"plain": {}, "causal": {"causal": True}, "softcap": {"softcap": 30.0}}
    axes = list(itertools.product(FEATURE_CONFIGS, scales, shapes))
    return [
        (cfg, Problem(113, 203, 6, 3, softmax_scale=scale, **shapes[shape]))
        for cfg, scale, shape in helpers.covering_sample(axes, lambda case: case, "softmax_scale")
    ]


@gpu
@gpu_cases("cfg, problem", softmax_scale_cases(), config_and_problem_id)
def test_softmax_scale(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


# Problems with query rows that attend no key: they must output exactly 0, with lse +inf.
ROWS_WITHOUT_KEYS = [
    Problem(256, 64, causal=True),  # whole query blocks before the first key
    Problem(1000, 999, causal=True),  # only the first row
    Problem(77, 1, causal=True, softcap=30.0),
    Problem(300, 17, window_size=(0, 0)),
    Problem(129, 1, window_size=(5, 3), alibi="per_head"),
    Problem(200, 100, window_size=(-1, 10), alibi="per_batch_head", heads_q=6, heads_kv=1),
]


@gpu
@gpu_cases(
    "cfg, problem",
    helpers.covering_sample(list(itertools.product(FEATURE_CONFIGS, ROWS_WITHOUT_KEYS)), lambda c: c, "no_keys"),
    config_and_problem_id,
)
def test_rows_without_keys(cfg, problem, rng):
    inputs = problem.make(cfg, rng)
    assert inputs.reference().rows_without_keys.any(), "the problem was meant to have rows without keys"
    check_forward(cfg, inputs)  # checks their zeros and +inf, among the rest


@gpu
@gpu_cases(
    "cfg, problem",
    [
        (cfg, Problem(seqlen_q, 0, causal=causal, alibi="per_head" if causal else None))
        for cfg in FEATURE_CONFIGS
        for seqlen_q in (1, 77, 128)
        for causal in (False, True)
    ],
    config_and_problem_id,
)
def test_no_keys_at_all(cfg, problem, rng):
    out, lse = check_forward(cfg, problem.make(cfg, rng))
    assert (out == 0).all() and (lse == math.inf).all()


# A multicast pair takes one query block of two heads when the query heads per key/value head are
# even, else two query blocks of one head (loading the KV tiles either visits, the last pair of an
# odd count with one block): both pairings under each mask kind, with ragged tails, and grids larger
# and smaller than the resident pairs.
PAIRINGS = [
    Problem(640, 700, 8, 4, causal=True),  # heads paired, 5 query blocks
    Problem(640, 700, 6, 6, causal=True),  # query blocks paired, the last alone
    Problem(333, 1000, 4, 2, window_size=(100, 50)),
    Problem(333, 1000, 3, 1, window_size=(100, 50)),  # a group of 3: query blocks paired
    Problem(1000, 1000, 8, 2, batch=3),
    Problem(1000, 1000, 5, 5, batch=3),
    Problem(4096, 4096, 16, 8, batch=4, causal=True),  # more work tiles than pairs fit at once
    Problem(4096, 4096, 16, 16, batch=4, causal=True),
]


@gpu
@gpu_cases(
    "cfg, problem",
    [(cfg, problem) for cfg in FEATURE_CONFIGS if getattr(cfg, "multicast", False) for problem in PAIRINGS],
    config_and_problem_id,
    "no multicast configuration compiled with every problem variant is under test (a default build has them)",
)
def test_multicast_pairings(cfg, problem, rng):
    check_forward(cfg, problem.make(cfg, rng))


def aligned_cases() -> list[tuple]:
    """Whole blocks, unmasked and causal, square and not: what every compiled configuration serves."""
    cases = []
    for cfg in CONFIGS:
        block = helpers.whole_blocks(cfg)
        for (seqlen_q, seqlen_k), causal in itertools.product(
            [(2 * block, 2 * block), (block, 3 * block), (3 * block, block)], (False, True)
        ):
            cases.append((cfg, Problem(seqlen_q, seqlen_k, 8, 2, causal=causal)))
    # A configuration's lengths depend on its blocks: sample over (configuration, shape index, causal).
    return helpers.covering_sample(
        cases,
        lambda case: (case[0], case[1].seqlen_q // helpers.whole_blocks(case[0]), case[1].causal),
        "aligned",
    )


@gpu
@gpu_cases("cfg, problem", aligned_cases(), config_and_problem_id, "no configuration under test")
def test_whole_blocks_on_every_config(cfg, problem, rng):
    assert problem.variant(cfg) in (ProblemVariant(MaskKind.NONE), ProblemVariant(MaskKind.CAUSAL))
    check_forward(cfg, problem.make(cfg, rng))


def compiled_kernel_cases() -> list[tuple]:
    selected = set(helpers.configs_under_test(decoding=True, fp8=True)) if BUILT else set()
    return [(cfg, variant) for cfg, variant in flash_attention.compiled_kernels() if cfg in selected] if BUILT else []


@gpu
@gpu_cases(
    "cfg, variant",
    compiled_kernel_cases(),
    lambda cfg, variant: f"{cfg.short_form()}-{helpers.variant_id(variant)}",
    "no configuration under test",
)
def test_every_compiled_kernel(cfg, variant, rng):
    """One problem per compiled (configuration, variant), chosen to need exactly that kernel (the
    e4m3 ones' with FP8 inputs, factors of 1 and a bfloat16 output)."""
    check_forward(cfg, helpers.problem_for_variant(cfg, variant).make(cfg, rng))


# name: (problem, how q, k and v are stored)
LAYOUTS = {
    "qkv_packed": Problem(197, 197, 6, 2, window_size=(40, 3), alibi="per_head"),
    "kv_packed": Problem(113, 203, 8, 2, causal=True, softcap=30.0),
    "heads_major": Problem(203, 113, 6, 3, window_size=(17, 60), alibi="per_batch_head"),
}


def stored_as(layout: str, q, k, v) -> list:
    if layout == "qkv_packed":
        return helpers.as_layout([q, k, v], "packed")
    if layout == "kv_packed":
        return [q, *helpers.as_layout([k, v], "packed")]
    return helpers.as_layout([q, k, v], "heads_major")


@gpu
@gpu_cases(
    "cfg, layout",
    [(cfg, layout) for cfg in FEATURE_CONFIGS for layout in LAYOUTS],
    lambda cfg, layout: f"{cfg.short_form()}-{layout}",
)
def test_strided_views_give_the_contiguous_result(cfg, layout, rng):
    inputs = LAYOUTS[layout].make(cfg, rng)
    expected, expected_lse = inputs.forward(cfg, return_lse=True)
    q, k, v = stored_as(layout, inputs.q, inputs.k, inputs.v)
    # o is the middle of three slots: the kernel must write all of it and nothing next to it.
    before, o, after = helpers.as_layout([helpers.nan_like(q)] * 3, "packed")
    assert not any(t.is_contiguous() for t in (k, v, o))
    out, lse = flash_attention.forward(cfg, q, k, v, o, return_lse=True, **inputs.kwargs)
    assert out.data_ptr() == o.data_ptr()
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    assert before.isnan().all() and after.isnan().all(), "the kernel wrote outside o"


@gpu
@gpu_cases("cfg", [(cfg,) for cfg in FEATURE_CONFIGS], lambda cfg: cfg.short_form())
def test_forward_timed_with_features(cfg, rng):
    inputs = Problem(113, 211, 6, 2, causal=True, softcap=30.0, alibi="per_head").make(cfg, rng)
    o = helpers.nan_like(inputs.q)
    q, k, v = inputs.q, inputs.k, inputs.v
    out, lse, runtime_ms = flash_attention.forward_timed(cfg, q, k, v, o, return_lse=True, **inputs.kwargs)
    assert isinstance(runtime_ms, float) and runtime_ms > 0
    assert out.data_ptr() == o.data_ptr()
    expected, expected_lse = inputs.forward(cfg, return_lse=True)
    assert torch.equal(out, expected) and torch.equal(lse, expected_lse)
    out, runtime_ms = flash_attention.forward_timed(cfg, q, k, v, **inputs.kwargs)
    assert torch.equal(out, expected) and runtime_ms > 0


# ----------------------------------------------------------------------------------------------
# The reference itself (CPU, torch only): against attention written out key by key in float64


def attention_key_by_key(
    q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None
):
    """The semantics spelled out one (batch, head, query) at a time: (o, lse) in float64."""
    batch, seqlen_q, heads_q, d_head = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    scale = d_head**-0.5 if softmax_scale is None else softmax_scale
    left, right = window_size[0], 0 if causal else window_size[1]
    q, k, v = q.double(), k.double(), v.double()
    out = torch.zeros((batch, seqlen_q, heads_q, d_head), dtype=torch.float64)
    lse = torch.full((batch, heads_q, seqlen_q), math.inf, dtype=torch.float64)
    for b, h, i in itertools.product(range(batch), range(heads_q), range(seqlen_q)):
        kv_head = h // (heads_q // heads_kv)
        diagonal = i + seqlen_k - seqlen_q
        keys = [
            j for j in range(seqlen_k) if (left < 0 or j >= diagonal - left) and (right < 0 or j <= diagonal + right)
        ]
        if not keys:
            continue
        scores = torch.stack([scale * (q[b, i, h] @ k[b, j, kv_head]) for j in keys])
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        if alibi_slopes is not None:
            slope = float(alibi_slopes[h] if alibi_slopes.dim() == 1 else alibi_slopes[b, h])
            scores = scores - slope * torch.tensor([abs(diagonal - j) for j in keys], dtype=torch.float64)
        lse[b, h, i] = torch.logsumexp(scores, 0)
        out[b, i, h] = torch.softmax(scores, 0) @ v[b, keys, kv_head]
    return out, lse


REFERENCE_CASES = {
    "plain": (6, 6, 2, 2, {}),
    "causal_longer_keys": (5, 9, 4, 2, {"causal": True}),
    "causal_rows_without_keys": (9, 5, 4, 1, {"causal": True}),
    "window_rows_without_keys": (9, 5, 3, 3, {"window_size": (1, 0)}),
    "window_softcap": (7, 7, 6, 2, {"window_size": (2, 1), "softcap": 3.0}),
    "right_only_scale": (4, 11, 2, 1, {"window_size": (-1, 2), "softmax_scale": 0.7}),
    "alibi_per_head": (5, 8, 2, 1, {"alibi_slopes": "per_head"}),
    "causal_left_alibi_softcap": (
        6,
        3,
        2,
        2,
        {"causal": True, "window_size": (1, 5), "alibi_slopes": "per_batch_head", "softcap": 2.0},
    ),
    "no_keys": (3, 0, 2, 2, {"causal": True}),
}


def reference_inputs(name: str, seed: int, dtype=torch.float16):
    seqlen_q, seqlen_k, heads_q, heads_kv, kwargs = REFERENCE_CASES[name]
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn((2, seqlen_q, heads_q, 16), generator=generator).to(dtype)
    k, v = (torch.randn((2, seqlen_k, heads_kv, 16), generator=generator).to(dtype) for _ in range(2))
    kwargs = dict(kwargs)
    if "alibi_slopes" in kwargs:
        shape = (heads_q,) if kwargs["alibi_slopes"] == "per_head" else (2, heads_q)
        kwargs["alibi_slopes"] = torch.rand(shape, generator=generator)
    return q, k, v, kwargs


@pytest.mark.parametrize("name", REFERENCE_CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_reference_is_the_semantics(name, dtype, seed):
    q, k, v, kwargs = reference_inputs(name, seed, dtype)
    expected, expected_lse = attention_key_by_key(q, k, v, **kwargs)
    reference = FloatReference(q, k, v, **kwargs)
    assert torch.allclose(reference.ref32.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(reference.lse == math.inf, expected_lse == math.inf)
    assert torch.allclose(reference.lse.double(), expected_lse, atol=1e-5, rtol=1e-5)
    assert torch.equal(reference.rows_without_keys, (expected_lse == math.inf)[0, 0])
    # The float64 result passes both criteria; the lse function agrees with the reference.
    assert reference.compare(expected).passed
    assert reference.compare_lse(expected_lse.float()).passed
    out, lse = reference_module.attention(q, k, v, torch.float32, return_lse=True, **kwargs)
    assert torch.equal(out, reference.ref32) and torch.equal(lse, reference.lse)


def test_reference_chunks_give_the_whole_result(seed, monkeypatch):
    q, k, v, kwargs = reference_inputs("causal_left_alibi_softcap", seed)
    whole = FloatReference(q, k, v, **kwargs)
    monkeypatch.setattr(reference_module, "REFERENCE_CHUNK_ELEMENTS", 1)  # one query row per chunk
    chunked = FloatReference(q, k, v, **kwargs)
    assert torch.allclose(chunked.ref32, whole.ref32, atol=1e-6) and torch.allclose(chunked.lse, whole.lse, atol=1e-6)
    assert chunked.ref16_max_error == pytest.approx(whole.ref16_max_error, rel=0.5, abs=1e-3)


def test_reference_criteria_reject_wrong_results(seed):
    q, k, v, kwargs = reference_inputs("causal_rows_without_keys", seed)
    reference = FloatReference(q, k, v, **kwargs)
    without_keys = reference.rows_without_keys
    assert without_keys.any() and not without_keys.all()
    assert reference.compare(reference.ref32).passed
    assert not reference.compare(reference.ref32 + 0.1).passed
    assert not reference.compare(torch.full_like(reference.ref32, math.nan)).passed
    unmasked = FloatReference(q, k, v)  # the same inputs without the mask
    assert not reference.compare(unmasked.ref32).passed

    assert reference.compare_lse(reference.lse).passed
    finite = reference.lse.clone()
    finite[..., without_keys] = 0.0  # a finite lse where no key is attended
    assert not reference.compare_lse(finite).infinities_match
    nan = reference.lse.clone()
    nan[0, 0, -1] = math.nan
    assert not reference.compare_lse(nan).passed
    assert not reference.compare_lse(reference.lse + 1e-2).passed
    assert not reference.compare_lse(reference.lse[..., 1:]).passed
    assert not reference.compare_lse(reference.lse.double()).passed


def test_tolerance_allows_rounding_the_largest_output():
    """The output tolerance is at least one unit in the last place of the largest output element
    (twice the rounding floor), however close ref16 happened to come; an error of two units fails."""
    q = torch.zeros(1, 1, 1, 8, dtype=torch.float16)
    v = torch.zeros(1, 3, 1, 8, dtype=torch.float16)
    v[0, :, 0, 0] = 1.5  # every key's value: the output is exactly 1.5 in float16 and in float32
    reference = FloatReference(q, torch.zeros_like(v), v)
    assert reference.ref16_max_error == 0 and reference.rounding_floor == 2.0**-11
    one_ulp, two_ulps = reference.ref32.clone(), reference.ref32.clone()
    one_ulp[0, 0, 0, 0] += 2.0**-10
    two_ulps[0, 0, 0, 0] += 2.0**-9
    assert reference.compare(one_ulp).passed and not reference.compare(two_ulps).passed
    assert reference_module.half_ulp(1.0, torch.bfloat16) == 2.0**-8
    assert reference_module.half_ulp(-3.0, torch.float16) == 2.0**-10
    assert reference_module.half_ulp(0.0, torch.float16) == 0.0


def test_all_zero_reference_needs_an_exact_match(seed):
    q, k, v, kwargs = reference_inputs("no_keys", seed)
    reference = FloatReference(q, k, v, **kwargs)
    assert reference.rows_without_keys.all() and reference.ref16_max_error == 0
    assert reference.compare(torch.zeros_like(q)).passed
    assert not reference.compare(torch.full_like(q, 1e-3)).passed


@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_each_compiled_kernel_has_a_problem_that_needs_it():
    """problem_for_variant's problems (test_every_compiled_kernel, tools/sanitize.sh) need exactly
    the kernel they are meant for, by the variant rules of the binding that Problem.variant mirrors."""
    for cfg, variant in flash_attention.compiled_kernels():
        assert helpers.problem_for_variant(cfg, variant).variant(cfg) == variant


@pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
def test_sanitizer_driver_lists_every_compiled_kernel():
    driver = pathlib.Path(__file__).resolve().parents[1] / "tools" / "sanitize_cases.py"
    result = subprocess.run([sys.executable, str(driver), "--list"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(compiled_kernel_cases())


def test_covering_sample_covers_every_pair(monkeypatch):
    monkeypatch.delenv(helpers.FULL_ENV, raising=False)
    cases = list(itertools.product(range(5), "abcd", (False, True), range(3)))
    sample = helpers.covering_sample(cases, lambda case: case, "test", extra_groups=[(0, 1, 2)])
    assert len(sample) < len(cases)
    for first, second in itertools.combinations(range(4), 2):
        wanted = {(a[first], a[second]) for a in cases}
        assert {(case[first], case[second]) for case in sample} == wanted
    assert {case[:3] for case in sample} == {case[:3] for case in cases}
    assert sample == helpers.covering_sample(cases, lambda case: case, "test", extra_groups=[(0, 1, 2)])
    monkeypatch.setenv(helpers.FULL_ENV, "1")
    assert helpers.covering_sample(cases, lambda case: case, "test") == cases
