"""FP8 KV caches in decoding: float8_e4m3fn k_cache and v_cache with k_descale and v_descale beside
float16 or bfloat16 queries, read by the SM80 family's decoding configurations (the e4m3 tiles
widened to float16 in registers). Against the float32 reference on the dequantised cache, and,
with descales that are powers of two (the dequantised values then exact in q's type), within a unit
in the last place of the same call on a 16-bit cache of those values (paged: bit for bit
against the dense FP8 cache): dense and paged, whole and split, one and
several queries with grouped heads, every mask kind and the score modifications; flash_attn_func
and flash_attn_varlen_func take such k and v too. The append's quantisation has its own tests
(test_kvcache_quantized_append.py). GPU tests: they skip, with the reason, without a GPU or a build.
"""

from __future__ import annotations

import pytest
import torch

import helpers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not helpers.extension_is_built(), reason=helpers.NOT_BUILT_REASON),
]

if helpers.extension_is_built():
    import flash_attention

E4M3 = torch.float8_e4m3fn


def _quantize(values, descale):
    """values (batch, seq, heads_kv, d) stored as e4m3 for these (batch, heads_kv) factors."""
    return (values.float() / descale[:, None, :, None]).clamp(-448, 448).to(E4M3)


def _dequantize(stored, descale, dtype):
    return (stored.float() * descale[:, None, :, None]).to(dtype)


def _descales(batch, heads_kv, rng, powers_of_two):
    """Per (batch, kv head) factors that differ: powers of two from 2^-3 to 2^2, or any in [0.01, 1)."""
    if powers_of_two:
        exponents = torch.randint(-3, 3, (batch, heads_kv), generator=rng, device="cuda")
        return torch.pow(2.0, exponents.float())
    return torch.rand((batch, heads_kv), generator=rng, device="cuda") * 0.99 + 0.01


def _cache(rng, dtype, batch, seqlen_k, heads_kv, d_head, powers_of_two=True):
    """An FP8 cache of random values, its descales, and the 16-bit cache of its dequantised values."""
    k_descale, v_descale = (_descales(batch, heads_kv, rng, powers_of_two) for _ in range(2))
    k8, v8 = (
        _quantize(helpers.random_tensor((batch, seqlen_k, heads_kv, d_head), torch.float32, rng) * 4, descale)
        for descale in (k_descale, v_descale)
    )
    return k8, v8, k_descale, v_descale, _dequantize(k8, k_descale, dtype), _dequantize(v8, v_descale, dtype)


def _skip_without_fp8_cache_kernels(dtype, d_head):
    """Skips, with the reason, where no decoding configuration of q's dtype and this head size has
    the FP8 cache's kernels (a build of a subset of the configurations): the automatic choice, which
    these calls use, then raises, as test_fp8_cache_arguments_are_checked requires."""
    for cfg in helpers.configs_under_test(decoding=True):
        if cfg.dtype.to_torch_dtype() == dtype and cfg.d_head == d_head and any(
            variant.kv_e4m3 for variant in flash_attention.compiled_variants(cfg)
        ):
            return
    pytest.skip(f"no {dtype} d_head {d_head} decoding configuration with FP8-cache kernels under test")


MASKS = {
    "none": {},
    "causal": dict(causal=True),
    "local": dict(window_size=(700, 3)),
    "softcap": dict(causal=True, softcap=30.0),
}


@pytest.mark.parametrize("num_splits", [0, 1, 3])
@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1), (4, 4)], ids=["gqa4", "mqa8", "mha"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("d_head", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_an_fp8_cache_computes_as_the_16_bit_cache_of_its_values(dtype, d_head, mask, heads, seqlen_q, num_splits, rng):
    """With power-of-two descales the kernels' work on the FP8 cache is that on the 16-bit cache of
    the dequantised values, but for float32 rounding order (the FP8 cache's products sum d_head in
    another order, and the compiler may fuse a multiply and an add in one kernel and not the other)
    and, beside bfloat16 queries, probabilities rounded to float16 rather than bfloat16: lse a few
    float32 units in the last place apart, outputs a unit in the last place of the largest. The
    output meets the float32 reference and repeats bit for bit."""
    _skip_without_fp8_cache_kernels(dtype, d_head)
    batch, seqlen_k = 3, 1500
    k8, v8, k_descale, v_descale, k16, v16 = _cache(rng, dtype, batch, seqlen_k, heads[1], d_head)
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    cache_seqlens = torch.tensor([1500, 1, 777], dtype=torch.int32, device="cuda")
    keywords = dict(cache_seqlens=cache_seqlens, num_splits=num_splits, return_softmax_lse=True, **MASKS[mask])
    out, lse = flash_attention.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, **keywords)
    expected, expected_lse = flash_attention.flash_attn_with_kvcache(q, k16, v16, **keywords)
    # A unit in the last place of the largest output: near 0 the output is a difference of larger
    # terms, whose float32 rounding then shows in more of its bits.
    torch.testing.assert_close(out, expected, rtol=0, atol=torch.finfo(dtype).eps * expected.abs().max().item())
    torch.testing.assert_close(lse, expected_lse, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    semantics = {name: value for name, value in MASKS[mask].items()}
    reference = helpers.assert_matches_reference(
        out, q, k8, v8, seqused_k=cache_seqlens, k_descale=k_descale, v_descale=v_descale, **semantics
    )
    helpers.assert_lse_matches(lse, reference)
    again = flash_attention.flash_attn_with_kvcache(q, k8, v8, k_descale=k_descale, v_descale=v_descale, **keywords)[0]
    assert torch.equal(out, again), "repeated calls differ"


@pytest.mark.parametrize("page_size", [16, 64, 256])
@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_a_paged_fp8_cache_reads_as_the_dense_one(seqlen_q, page_size, rng):
    """Pages in random order, with NaN in the rows no sequence holds: bit for bit the dense FP8
    cache's output."""
    dtype, batch, heads, d_head = torch.bfloat16, 3, (16, 4), 128
    _skip_without_fp8_cache_kernels(dtype, d_head)
    k8, v8, k_descale, v_descale, _, _ = _cache(rng, dtype, batch, 2000, heads[1], d_head, powers_of_two=False)
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    lengths = [2000, 33, 1024]
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    paged = helpers.PagedCache.of(
        [k8[b, :n].view(torch.uint8) for b, n in enumerate(lengths)],
        [v8[b, :n].view(torch.uint8) for b, n in enumerate(lengths)],
        page_size,
        rng,
    )
    pool_k, pool_v = paged.k.view(E4M3), paged.v.view(E4M3)
    keywords = dict(cache_seqlens=cache_seqlens, causal=True, k_descale=k_descale, v_descale=v_descale)
    out = flash_attention.flash_attn_with_kvcache(q, pool_k, pool_v, block_table=paged.block_table, **keywords)
    dense = flash_attention.flash_attn_with_kvcache(q, k8, v8, **keywords)
    assert torch.equal(out, dense), "the paged FP8 cache gives other bits than the dense one"
    helpers.assert_matches_reference(
        out, q, k8, v8, seqused_k=cache_seqlens, causal=True, k_descale=k_descale, v_descale=v_descale
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_any_descales_meet_the_float32_reference(dtype, rng):
    """Descales that are not powers of two, with leftpad, cache_batch_idx and ALiBi."""
    batch, heads, d_head = 4, (8, 2), 128
    _skip_without_fp8_cache_kernels(dtype, d_head)
    k8, v8, k_descale, v_descale, _, _ = _cache(rng, dtype, 5, 900, heads[1], d_head, powers_of_two=False)
    q = helpers.random_tensor((batch, 2, heads[0], d_head), dtype, rng)
    cache_seqlens = torch.tensor([900, 400, 17, 640], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([0, 100, 0, 39], dtype=torch.int32, device="cuda")
    slopes = torch.rand((heads[0],), generator=rng, device="cuda")
    index = torch.tensor([4, 0, 2, 1], dtype=torch.int32, device="cuda")
    descales = dict(k_descale=k_descale[index.long()], v_descale=v_descale[index.long()])
    out = flash_attention.flash_attn_with_kvcache(
        q, k8, v8, cache_seqlens=cache_seqlens, cache_leftpad=leftpad, cache_batch_idx=index, alibi_slopes=slopes,
        causal=True, **descales,
    )  # fmt: skip
    gathered = (k8[index.long()], v8[index.long()])
    helpers.assert_matches_reference(
        out, q, *gathered, seqused_k=cache_seqlens - leftpad, leftpad_k=leftpad, alibi_slopes=slopes, causal=True,
        **descales,
    )  # fmt: skip


def test_flash_attn_func_and_the_varlen_call_take_an_fp8_cache(rng):
    """Dense and packed calls of 16-bit q with e4m3 k and v (the decoding configuration's kernels,
    whatever the query count) against the reference; descales of None are factors of 1."""
    dtype, heads, d_head = torch.bfloat16, (8, 2), 64
    _skip_without_fp8_cache_kernels(dtype, d_head)
    k8, v8, k_descale, v_descale, _, _ = _cache(rng, dtype, 2, 300, heads[1], d_head, powers_of_two=False)
    q = helpers.random_tensor((2, 200, heads[0], d_head), dtype, rng)
    out = flash_attention.flash_attn_func(q, k8, v8, causal=True, k_descale=k_descale, v_descale=v_descale)
    helpers.assert_matches_reference(out, q, k8, v8, causal=True, k_descale=k_descale, v_descale=v_descale)
    ones = flash_attention.flash_attn_func(q, k8, v8, causal=True)
    helpers.assert_matches_reference(ones, q, k8, v8, causal=True)

    lengths = [200, 0, 77]
    cu_seqlens = torch.tensor([0, 200, 200, 277], dtype=torch.int32, device="cuda")
    packed_q = helpers.random_tensor((277, heads[0], d_head), dtype, rng)
    packed_k, packed_v = (_quantize(t.float()[None], torch.ones((1, heads[1]), device="cuda"))[0] for t in (
        helpers.random_tensor((277, heads[1], d_head), torch.float32, rng) for _ in range(2)))  # fmt: skip
    descales = torch.rand((len(lengths), heads[1]), generator=rng, device="cuda") + 0.5
    packed = dict(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=200, max_seqlen_k=200, causal=True)
    out = flash_attention.flash_attn_varlen_func(
        packed_q, packed_k, packed_v, k_descale=descales, v_descale=descales, **packed
    )
    helpers.assert_matches_reference(out, packed_q, packed_k, packed_v, k_descale=descales, v_descale=descales, **packed)


def test_fp8_cache_arguments_are_checked(rng):
    dtype, heads, d_head = torch.bfloat16, (8, 2), 128
    k8, v8, k_descale, v_descale, k16, v16 = _cache(rng, dtype, 2, 64, heads[1], d_head)
    q = helpers.random_tensor((2, 1, heads[0], d_head), dtype, rng)
    seqlens = torch.tensor([64, 10], dtype=torch.int32, device="cuda")
    call = flash_attention.flash_attn_with_kvcache
    with pytest.raises(TypeError, match="^v: dtype bfloat16; an FP8 cache has float8_e4m3fn keys and values both"):
        flash_attention.forward(None, q, k8, v16, seqused_k=seqlens)
    with pytest.raises(TypeError, match="^k: dtype Half differs from q's BFloat16"):
        flash_attention.forward(None, q, k16.half(), v16.half(), seqused_k=seqlens)
    with pytest.raises(ValueError, match="^q_descale: descales apply to float8_e4m3fn inputs only; q is bfloat16"):
        flash_attention.forward(None, q, k8, v8, seqused_k=seqlens, q_descale=k_descale)
    with pytest.raises(ValueError, match="^k_descale: descales apply to float8_e4m3fn inputs only; k is bfloat16"):
        call(q, k16, v16, cache_seqlens=seqlens, k_descale=k_descale)
    with pytest.raises(ValueError, match=r"^v_descale: shape \[2, 1\] must be \(batch, heads_kv\) = \(2, 2\)"):
        call(q, k8, v8, cache_seqlens=seqlens, v_descale=v_descale[:, :1])
    with pytest.raises(TypeError, match="^k_descale: dtype must be float32"):
        call(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale.double())
    big = helpers.random_tensor((2, 64, heads[1], 256), torch.float32, rng).to(E4M3)
    with pytest.raises(ValueError, match="^q: no configuration compiled into this build .* an e4m3 KV cache"):
        call(helpers.random_tensor((2, 1, heads[0], 256), dtype, rng), big, big, cache_seqlens=seqlens)
    # The context stays usable.
    _skip_without_fp8_cache_kernels(dtype, d_head)
    call(q, k8, v8, cache_seqlens=seqlens, k_descale=k_descale, v_descale=v_descale)
    torch.cuda.synchronize()
