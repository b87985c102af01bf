"""Decoding: few queries against many keys. A split over the keys (num_splits, and the heuristic's
choice), single-query calls with grouped heads packed into one block, paged caches (block_table)
and caches indexed per sequence (kv_batch_idx), and flash_attn_with_kvcache (new keys appended in
place and rotary embedding in one kernel, cache_leftpad, cache_batch_idx, paged caches, CUDA graphs,
torch.compile), each against
the float32 reference, and the paged and indexed calls bit for bit against the same call on the
keys laid out densely. GPU tests: they skip, with the reason, without a GPU or a build.
"""

from __future__ import annotations

import math

import pytest
import torch

import helpers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not helpers.extension_is_built(), reason=helpers.NOT_BUILT_REASON),
]

if helpers.extension_is_built():
    import flash_attention


def _splitting_configs():
    """Per dtype and head size under test, an SM80 configuration with its varlen variants (those
    splits run on) and the dense ones (a call that does not split)."""
    chosen = {}
    for cfg in helpers.configs_under_test():
        variants = flash_attention.compiled_variants(cfg)
        if cfg.family == "sm80" and any(v.varlen for v in variants) and not all(v.varlen for v in variants):
            chosen.setdefault((cfg.dtype, cfg.d_head), cfg)
    return list(chosen.values())


def _decode_inputs(rng, dtype, d_head, batch=2, seqlen_q=1, seqlen_k=1000, heads=(8, 2)):
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    k, v = (helpers.random_tensor((batch, seqlen_k, heads[1], d_head), dtype, rng) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("num_splits", [2, 3, 7, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_a_split_over_the_keys_matches_the_reference_and_repeats_bitwise(num_splits, causal, rng):
    configs = _splitting_configs()
    if not configs:
        pytest.skip("no SM80 configuration with varlen kernels under test")
    for cfg in configs[:4]:
        dtype = cfg.dtype.to_torch_dtype()
        q, k, v = _decode_inputs(rng, dtype, cfg.d_head, seqlen_q=5, seqlen_k=1003)
        out, lse = flash_attention.forward(
            cfg, q, k, v, helpers.nan_like(q), causal=causal, return_lse=True, num_splits=num_splits
        )
        reference = helpers.assert_matches_reference(out, q, k, v, causal=causal)
        helpers.assert_lse_matches(lse, reference)
        again, lse_again = flash_attention.forward(cfg, q, k, v, causal=causal, return_lse=True, num_splits=num_splits)
        assert torch.equal(out, again) and torch.equal(lse, lse_again), f"{cfg}: repeated split calls differ"


def test_splits_run_with_every_per_sequence_argument_and_empty_splits(rng):
    """Sequences whose keys are fewer than the splits (some splits see no key), one without keys,
    seqused and leftpad, and a packed batch."""
    configs = _splitting_configs()
    if not configs:
        pytest.skip("no SM80 configuration with varlen kernels under test")
    cfg = configs[0]
    dtype = cfg.dtype.to_torch_dtype()
    q, k, v = _decode_inputs(rng, dtype, cfg.d_head, batch=4, seqlen_q=3, seqlen_k=700)
    seqused_k = torch.tensor([700, 5, 0, 333], dtype=torch.int32, device="cuda")
    leftpad_k = torch.tensor([0, 2, 0, 100], dtype=torch.int32, device="cuda")
    keywords = dict(seqused_k=seqused_k - leftpad_k.clamp(max=seqused_k), leftpad_k=leftpad_k, causal=True)
    out, lse = flash_attention.forward(cfg, q, k, v, helpers.nan_like(q), return_lse=True, num_splits=16, **keywords)
    reference = helpers.assert_matches_reference(out, q, k, v, **keywords)
    helpers.assert_lse_matches(lse, reference)
    helpers.assert_rows_without_keys_are_zero(out, reference)

    lengths = [1, 900, 0, 64]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = helpers.random_tensor((sum(lengths), 4, cfg.d_head), dtype, rng)
    k, v = (helpers.random_tensor((sum(lengths), 2, cfg.d_head), dtype, rng) for _ in range(2))
    packed = dict(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=900, max_seqlen_k=900, causal=True)
    out = flash_attention.forward(cfg, q, k, v, helpers.nan_like(q), num_splits=5, **packed)
    helpers.assert_matches_reference(out, q, k, v, **packed)


@pytest.mark.parametrize("heads", [(32, 8), (8, 1), (4, 4)], ids=["gqa4", "mqa8", "mha"])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("d_head", [64, 128])
def test_single_query_decoding_runs_split_and_packed_automatically(d_head, causal, heads, rng):
    """flash_attn_func on one query against a long cache: the heuristic splits, and grouped heads are
    packed; the output, lse and run-to-run bits as always."""
    q, k, v = _decode_inputs(rng, torch.bfloat16, d_head, batch=1, seqlen_q=1, seqlen_k=8000, heads=heads)
    out, lse, _ = flash_attention.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    reference = helpers.assert_matches_reference(out, q, k, v, causal=causal)
    helpers.assert_lse_matches(lse, reference)
    assert torch.equal(flash_attention.flash_attn_func(q, k, v, causal=causal), out)
    # SDPA's layout (heads first), as transformers calls it: one query aligned to the last key sees
    # every key (SDPA's is_causal aligns to the first, so it is left off).
    ours = flash_attention.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=heads[0] != heads[1]
    )
    torch.testing.assert_close(ours.transpose(1, 2), out, atol=0, rtol=0)


@pytest.mark.parametrize("seqlen_q", [1, 2, 7, 16])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["gqa4", "mqa8"])
@pytest.mark.parametrize("mask", ["none", "causal", "local"])
def test_several_queries_with_grouped_heads_run_packed(mask, heads, seqlen_q, rng):
    """Speculative decoding: each query's grouped heads are rows of one block and share the query's
    diagonal (ForwardParams::rows_per_query), on every family's configuration under test and the
    automatic choice; the output, lse and a given o as always, and SDPA's layout (heads first)
    gives the same bits."""
    keywords = {"none": {}, "causal": dict(causal=True), "local": dict(window_size=(300, 2))}[mask]
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128, batch=2, seqlen_q=seqlen_q, seqlen_k=1500, heads=heads)
    configs = {c.family: c for c in helpers.configs_under_test() if c.d_head == 128 and c.dtype.name == "BF16"}
    for cfg in [*configs.values(), None]:
        o = helpers.nan_like(q)
        out, lse = helpers.call_or_skip_in_a_subset_build(
            lambda: flash_attention.forward(cfg, q, k, v, o, return_lse=True, **keywords)
        )
        assert out.data_ptr() == o.data_ptr(), f"{cfg}: the output is not the o given"
        reference = helpers.assert_matches_reference(out, q, k, v, **keywords)
        helpers.assert_lse_matches(lse, reference)
        again = flash_attention.forward(cfg, q, k, v, **keywords)
        assert torch.equal(out, again), f"{cfg}: repeated calls differ"
    if mask == "none":
        heads_first = flash_attention.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True)
        assert torch.equal(heads_first.transpose(1, 2), again), "SDPA's layout gives other bits"


def _cuda_kernels(call):
    """The names of the CUDA kernels `call` runs (after a warm-up call)."""
    call()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call()
        torch.cuda.synchronize()
    return [event.name for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@pytest.mark.parametrize("num_splits", [0, 1, 5])
@pytest.mark.parametrize("d_head", [128, 72, 59])
@pytest.mark.parametrize("heads", [(32, 8), (12, 2)], ids=["group4", "group6"])
def test_grouped_rows_are_read_and_written_in_the_calls_layout(heads, d_head, num_splits, rng):
    """Several queries with grouped heads on the decoding configuration: its kernel reads q and writes
    o in their own layouts, whatever their strides (a query's heads do not continue into the next
    query's), whole or split, with groups of a power of two heads and not (the kernel divides rows
    by the group through a reciprocal); a head size served by a larger configuration runs in place,
    one that is not a multiple of 8 on padded copies. The output matches the reference, is the o
    given, and repeats bit for bit; contiguous inputs give the same bits."""
    (heads_q, heads_kv), seqlen_q = heads, 4
    wide = helpers.random_tensor((2, seqlen_q, 2 * heads_q, d_head), torch.bfloat16, rng)
    q = wide[:, :, ::2]  # heads 2 d_head apart, queries 2 heads_q d_head apart
    k, v = (helpers.random_tensor((2, 1500, heads_kv, d_head), torch.bfloat16, rng) for _ in range(2))
    o = helpers.nan_like(q.transpose(1, 2).contiguous()).transpose(1, 2)  # heads first in memory
    out, lse = helpers.call_or_skip_in_a_subset_build(
        lambda: flash_attention.forward(None, q, k, v, o, return_lse=True, causal=True, num_splits=num_splits)
    )
    assert out.data_ptr() == o.data_ptr(), "the output is not the o given"
    reference = helpers.assert_matches_reference(out, q, k, v, causal=True)
    helpers.assert_lse_matches(lse, reference)
    again = flash_attention.forward(None, q, k, v, causal=True, num_splits=num_splits)
    assert torch.equal(out, again), "repeated calls differ"
    contiguous = flash_attention.forward(None, q.contiguous(), k, v, causal=True, num_splits=num_splits)
    assert torch.equal(out, contiguous), "the layouts give other bits"


def test_several_queries_run_without_copies_on_the_decoding_configuration(rng):
    """A speculative step (4 queries, 4 query heads per key/value head) on the decoding configuration
    runs our kernels alone: no PyTorch copy packs q or unpacks o."""
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128, batch=1, seqlen_q=4, seqlen_k=8192, heads=(32, 8))
    kernels = _cuda_kernels(lambda: flash_attention.flash_attn_func(q, k, v, causal=True))
    assert all("_forward_kernel" in name for name in kernels), f"PyTorch kernels ran beside ours: {kernels}"


def test_num_splits_is_checked(rng):
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128)
    with pytest.raises(ValueError, match="^num_splits: must be 0"):
        flash_attention.forward(flash_attention.choose_config(q, k).config, q, k, v, num_splits=-1)
    with pytest.raises(TypeError, match="^num_splits: expected an int"):
        flash_attention.forward(flash_attention.choose_config(q, k).config, q, k, v, num_splits=1.5)
    hopper = [c for c in helpers.configs_under_test() if c.family == "sm90" and c.d_head == 128 and c.dtype.name == "BF16"]
    if hopper:
        with pytest.raises(ValueError, match="^num_splits: .* does not split the keys"):
            flash_attention.forward(hopper[0], q, k, v, num_splits=4)


# ----------------------------------------------------------------------------------------------
# flash_attn_with_kvcache


def _rotary_reference(x, cos, sin, positions, interleaved):
    """x (batch, n, heads, d) rotated at positions (batch, n), as complex multiplications in float64."""
    half = cos.shape[1]
    x = x.double()
    angle_cos = cos.double()[positions][:, :, None, :]
    angle_sin = sin.double()[positions][:, :, None, :]
    rotation = torch.complex(angle_cos, angle_sin)
    part = x[..., : 2 * half]
    if interleaved:
        pairs = torch.complex(part[..., 0::2], part[..., 1::2]) * rotation
        rotated = torch.stack((pairs.real, pairs.imag), dim=-1).flatten(-2)
    else:
        pairs = torch.complex(part[..., :half], part[..., half:]) * rotation
        rotated = torch.cat((pairs.real, pairs.imag), dim=-1)
    return torch.cat((rotated, x[..., 2 * half :]), dim=-1)


@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("seqlen_q", [1, 4, 16])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("with_leftpad", [False, True], ids=["no_leftpad", "leftpad"])
def test_kvcache_appends_rotates_and_attends(seqlen_q, causal, rotary, with_leftpad, rng):
    dtype, d_head, heads, batch, cache_len = torch.bfloat16, 128, (8, 2), 3, 600
    k_cache, v_cache = (helpers.random_tensor((batch, cache_len, heads[1], d_head), dtype, rng) for _ in range(2))
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, seqlen_q, heads[1], d_head), dtype, rng) for _ in range(2))
    cache_seqlens = torch.tensor([0, 517, 250], dtype=torch.int32, device="cuda")
    leftpad = torch.tensor([0, 17, 200], dtype=torch.int32, device="cuda") if with_leftpad else None
    keywords = {}
    q_expected, k_expected = q.double(), k_new.double()
    if rotary:
        rotary_dim = 64
        angles = torch.rand((cache_len, rotary_dim // 2), generator=rng, device="cuda") * 2 * math.pi
        cos, sin = angles.cos(), angles.sin()
        interleaved = rotary == "interleaved"
        keywords = dict(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
        new_positions = cache_seqlens.long()[:, None] + torch.arange(seqlen_q, device="cuda")
        q_positions = new_positions if causal else cache_seqlens.long()[:, None].expand(-1, seqlen_q)
        q_expected = _rotary_reference(q, cos, sin, q_positions, interleaved)
        k_expected = _rotary_reference(k_new, cos, sin, new_positions, interleaved)
    expected_k_cache, expected_v_cache = k_cache.double().clone(), v_cache.double().clone()
    for b, start in enumerate(cache_seqlens.tolist()):
        expected_k_cache[b, start : start + seqlen_q] = k_expected[b]
        expected_v_cache[b, start : start + seqlen_q] = v_new[b].double()
    q_before = q.clone()

    out, lse = flash_attention.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, cache_leftpad=leftpad, causal=causal,
        return_softmax_lse=True, **keywords,
    )
    assert torch.equal(q, q_before), "q was modified"
    # The appended rows: the rotated keys rounded once to bf16.
    torch.testing.assert_close(k_cache.double(), expected_k_cache.to(dtype).double(), atol=1e-2, rtol=0)
    assert torch.equal(v_cache.double(), expected_v_cache)
    used = cache_seqlens + seqlen_q - (leftpad if leftpad is not None else 0)
    reference = helpers.assert_matches_reference(
        out, q_expected.to(dtype), k_cache, v_cache, causal=causal, seqused_k=used, leftpad_k=leftpad
    )
    helpers.assert_lse_matches(lse, reference)


def _rotary_step_inputs(rng, dtype=torch.bfloat16, batch=2, cache_len=300, seqlen_new=2, heads=(8, 2), d_head=128):
    k_cache, v_cache = (helpers.random_tensor((batch, cache_len, heads[1], d_head), dtype, rng) for _ in range(2))
    q = helpers.random_tensor((batch, seqlen_new, heads[0], d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, seqlen_new, heads[1], d_head), dtype, rng) for _ in range(2))
    angles = torch.rand((cache_len, d_head // 4), generator=rng, device="cuda") * 2 * math.pi
    seqlens = torch.tensor([7, 250][:batch], dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, k_new, v_new, angles.cos(), angles.sin(), seqlens


def test_a_step_appends_and_rotates_in_one_kernel(rng):
    """A decode step's append, rotations and attention are kernels of ours; of PyTorch's, only the
    lengths' sum (seqused_k = cache_seqlens + new keys) runs."""
    q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens = _rotary_step_inputs(rng, seqlen_new=1)
    step = dict(rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, causal=True)
    kernels = _cuda_kernels(lambda: flash_attention.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **step))
    ours = [name for name in kernels if "_forward_kernel" in name]
    assert sum("append_forward_kernel" in name for name in kernels) == 1, kernels
    assert len(kernels) - len(ours) <= 1, f"PyTorch kernels ran beside ours: {kernels}"


def test_rotary_tables_in_the_tensors_dtype_rotate_as_float32_tables_of_the_same_values(rng):
    """cos and sin may be q's dtype (FlashAttention-2's) or float32: the same values give the same
    bits in the caches and the output."""
    q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens = _rotary_step_inputs(rng)
    tables = {
        dtype: (cos.to(torch.bfloat16).to(dtype), sin.to(torch.bfloat16).to(dtype))
        for dtype in (torch.bfloat16, torch.float32)
    }
    results = {}
    for dtype, (c, s) in tables.items():
        caches = (k_cache.clone(), v_cache.clone())
        out = flash_attention.flash_attn_with_kvcache(
            q, *caches, k_new, v_new, rotary_cos=c, rotary_sin=s, cache_seqlens=seqlens, causal=True,
            rotary_interleaved=False,
        )
        results[dtype] = (out, *caches)
    for ours, theirs in zip(results[torch.bfloat16], results[torch.float32], strict=True):
        assert torch.equal(ours, theirs), "bfloat16 and float32 tables of the same values differ"


def test_a_step_with_appends_compiles_whole_and_declares_the_cache_written(rng):
    """torch.compile traces the append operator (its fake implementation) and the attention in one
    graph; the compiled step writes the caches as the eager one does, and gives the same bits."""
    q, k_cache, v_cache, k_new, v_new, cos, sin, seqlens = _rotary_step_inputs(rng)
    caches = (k_cache.clone(), v_cache.clone())

    def step(q, k_cache, v_cache, k_new, v_new, seqlens):
        return flash_attention.flash_attn_with_kvcache(
            q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, causal=True
        )

    eager = step(q, k_cache, v_cache, k_new, v_new, seqlens)
    compiled = torch.compile(step, fullgraph=True)(q, *caches, k_new, v_new, seqlens)
    assert torch.equal(compiled, eager), "the compiled step differs"
    assert torch.equal(caches[0], k_cache) and torch.equal(caches[1], v_cache), "the compiled step's caches differ"


def test_kvcache_rejects_what_it_cannot_run(rng):
    q, k, v = _decode_inputs(rng, torch.bfloat16, 64)
    table = torch.zeros(2, 1, dtype=torch.int32, device="cuda")
    index = torch.zeros(2, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="^cache_batch_idx: is not given with block_table"):
        flash_attention.flash_attn_with_kvcache(q, k, v, cache_seqlens=3, block_table=table, cache_batch_idx=index)
    with pytest.raises(ValueError, match="^block_table: expected an int32 tensor"):
        flash_attention.flash_attn_with_kvcache(q, k, v, k[:, :1], v[:, :1], cache_seqlens=3, block_table=table.long())
    with pytest.raises(ValueError, match="^cache_seqlens: expected an int32 tensor of shape"):
        flash_attention.flash_attn_with_kvcache(q, k, v, cache_seqlens=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="^k, v: give both"):
        flash_attention.flash_attn_with_kvcache(q, k, v, k=k[:, :1], cache_seqlens=3)
    with pytest.raises(ValueError, match="^k, v: expected \\(batch, seqlen_new, heads_kv, d\\)"):
        flash_attention.flash_attn_with_kvcache(q, k, v, k[:1, :1], v[:1, :1], cache_seqlens=3)
    with pytest.raises(ValueError, match="^rotary_cos: rotary_dim 80 is more than d_head 64"):
        angles = torch.zeros(8, 40, device="cuda")
        flash_attention.flash_attn_with_kvcache(q, k, v, cache_seqlens=3, rotary_cos=angles, rotary_sin=angles)
    with pytest.raises(TypeError, match="^k: expected a torch.Tensor or None"):
        flash_attention.flash_attn_with_kvcache(q, k, v, k=[1], v=[1], cache_seqlens=3)


def test_the_debug_check_names_cache_seqlens(rng, monkeypatch):
    """FLASH_ATTENTION_CHECK_SEQLENS=1: lengths whose new keys would pass the cache's end raise,
    naming cache_seqlens, before anything is written."""
    monkeypatch.setenv("FLASH_ATTENTION_CHECK_SEQLENS", "1")
    q, k, v = _decode_inputs(rng, torch.bfloat16, 64, seqlen_k=100)
    k_before = k.clone()
    with pytest.raises(ValueError, match="^cache_seqlens: "):
        flash_attention.flash_attn_with_kvcache(q, k, v, k[:, :2].clone(), v[:, :2].clone(), cache_seqlens=99)
    assert torch.equal(k, k_before)


@pytest.mark.parametrize("paged", [False, True], ids=["dense", "paged"])
def test_a_decode_step_is_captured_once_and_replayed_as_the_lengths_grow(paged, rng):
    """CUDA graphs: cache_seqlens a tensor, updated in place between replays; no host sync."""
    dtype, d_head, heads, batch, cache_len = torch.bfloat16, 128, (32, 8), 2, 4096
    k_cache, v_cache = (helpers.random_tensor((batch, cache_len, heads[1], d_head), dtype, rng) for _ in range(2))
    q = helpers.random_tensor((batch, 1, heads[0], d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, 1, heads[1], d_head), dtype, rng) for _ in range(2))
    cache_seqlens = torch.tensor([1000, 3000], dtype=torch.int32, device="cuda")
    paging = _paged(k_cache, v_cache, 16, rng) if paged else None

    def step():
        if paging is None:
            return flash_attention.flash_attn_with_kvcache(
                q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, causal=True
            )
        out = flash_attention.flash_attn_with_kvcache(
            q, paging.k, paging.v, k_new, v_new, cache_seqlens=cache_seqlens, block_table=paging.block_table, causal=True
        )
        k_cache.copy_(_dense(paging, paging.k))  # what the reference reads
        v_cache.copy_(_dense(paging, paging.v))
        return out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture (first-call allocations)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for lengths in ([1001, 3001], [1500, 10], [4000, 2047]):
        cache_seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        torch.testing.assert_close(out, eager, atol=0, rtol=0)
        used = cache_seqlens + 1
        helpers.assert_matches_reference(out, q, k_cache, v_cache, causal=True, seqused_k=used)


# ----------------------------------------------------------------------------------------------
# Paged caches (block_table) and caches indexed per sequence (kv_batch_idx)


def _paged(k, v, page_size, rng):
    """helpers.PagedCache of a dense (batch, seqlen, heads, d) k and v."""
    return helpers.PagedCache.of(list(k), list(v), page_size, rng)


def _dense(cache, pool):
    """The (batch, seqlen, heads, d) rows a paged cache's pool holds."""
    return torch.stack([cache.rows(pool, b, n) for b, n in enumerate(cache.lengths)])


def _paged_config():
    configs = _splitting_configs()
    if not configs:
        pytest.skip("no SM80 configuration with varlen kernels under test")
    by_size = {cfg.d_head: cfg for cfg in configs if cfg.dtype.name == "BF16"}
    return by_size.get(128, configs[0])


@pytest.mark.parametrize("page_size", [16, 48, 64, 256])
@pytest.mark.parametrize("num_splits", [1, 6])
@pytest.mark.parametrize("seqlen_q", [1, 5])
@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
def test_a_paged_cache_gives_the_bits_of_the_same_keys_in_rows(page_size, num_splits, seqlen_q, causal, rng):
    cfg = _paged_config()
    dtype = cfg.dtype.to_torch_dtype()
    q, k, v = _decode_inputs(rng, dtype, cfg.d_head, batch=3, seqlen_q=seqlen_q, seqlen_k=700)
    used = torch.tensor([700, 1, 333], dtype=torch.int32, device="cuda")
    # Each sequence's pages hold only its used keys: the table's columns past them point past the pool.
    lengths = used.tolist()
    pages = helpers.PagedCache.of([k[b, :n] for b, n in enumerate(lengths)], [v[b, :n] for b, n in enumerate(lengths)], page_size, rng)
    keywords = dict(causal=causal, return_lse=True, num_splits=num_splits, seqused_k=used)
    out, lse = flash_attention.forward(cfg, q, pages.k, pages.v, helpers.nan_like(q), block_table=pages.block_table, **keywords)
    dense_out, dense_lse = flash_attention.forward(cfg, q, k, v, **keywords)
    assert torch.equal(out, dense_out) and torch.equal(lse, dense_lse), f"{cfg}: paged and dense calls differ"
    reference = helpers.assert_matches_reference(out, q, k, v, causal=causal, seqused_k=used)
    helpers.assert_lse_matches(lse, reference)


def test_a_packed_batch_reads_a_paged_cache(rng):
    """flash_attn_varlen_func with block_table: q packed, cu_seqlens_k giving only the key counts."""
    cfg = _paged_config()
    dtype = cfg.dtype.to_torch_dtype()
    lengths_q, lengths_k = [3, 0, 1, 7], [100, 0, 257, 64]
    cu_q, cu_k = (
        torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device="cuda") for n in (lengths_q, lengths_k)
    )
    q = helpers.random_tensor((sum(lengths_q), 4, cfg.d_head), dtype, rng)
    k, v = _decode_inputs(rng, dtype, cfg.d_head, batch=4, seqlen_q=1, seqlen_k=300, heads=(4, 2))[1:]
    pages = helpers.PagedCache.of([k[b, :n] for b, n in enumerate(lengths_k)], [v[b, :n] for b, n in enumerate(lengths_k)], 32, rng)
    packed = dict(cu_seqlens_q=cu_q, max_seqlen_q=7, max_seqlen_k=257, causal=True)
    paged = dict(block_table=pages.block_table, cu_seqlens_k=cu_k)
    out = flash_attention.forward(cfg, q, pages.k, pages.v, helpers.nan_like(q), **paged, **packed)
    k_packed, v_packed = (torch.cat([t[b, :n] for b, n in enumerate(lengths_k)]) for t in (k, v))
    dense = flash_attention.forward(cfg, q, k_packed, v_packed, cu_seqlens_k=cu_k, **packed)
    assert torch.equal(out, dense), "the paged and packed calls differ"
    helpers.assert_matches_reference(out, q, k_packed, v_packed, cu_seqlens_k=cu_k, **packed)
    automatic = flash_attention.flash_attn_varlen_func(
        q, pages.k, pages.v, cu_q, cu_k, 7, 257, causal=True, block_table=pages.block_table
    )
    helpers.assert_matches_reference(automatic, q, k_packed, v_packed, cu_seqlens_k=cu_k, **packed)
    # Through the torch operator: traced whole, the table one more tensor argument.
    compiled = torch.compile(
        lambda *args: flash_attention.flash_attn_varlen_func(*args, 7, 257, causal=True, block_table=pages.block_table),
        fullgraph=True,
    )
    assert torch.equal(compiled(q, pages.k, pages.v, cu_q, cu_k), automatic), "the compiled call differs"


def test_kv_batch_idx_picks_each_sequences_cache_entry(rng):
    """Every family with a varlen kernel under test, and the automatic choice: bit for bit the call
    on the entries gathered."""
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128, batch=3, seqlen_q=4, seqlen_k=500)
    k_cache, v_cache = (helpers.random_tensor((5, 500, 2, 128), torch.bfloat16, rng) for _ in range(2))
    index = torch.tensor([4, 0, 2], dtype=torch.int32, device="cuda")
    used = torch.tensor([500, 77, 1], dtype=torch.int32, device="cuda")
    gathered = [t[index.long()] for t in (k_cache, v_cache)]
    configs = {c.family: c for c in helpers.configs_under_test() if c.d_head == 128 and c.dtype.name == "BF16"
               and any(variant.varlen for variant in flash_attention.compiled_variants(c))}
    for cfg in [*configs.values(), None]:
        out = flash_attention.forward(cfg, q, k_cache, v_cache, kv_batch_idx=index, seqused_k=used, causal=True)
        gathered_out = flash_attention.forward(cfg, q, *gathered, seqused_k=used, causal=True)
        assert torch.equal(out, gathered_out), f"{cfg}: indexed and gathered differ"
        helpers.assert_matches_reference(out, q, *gathered, seqused_k=used, causal=True)


@pytest.mark.parametrize("seqlen_q", [1, 4])
@pytest.mark.parametrize("layout", ["paged", "batch_idx"])
def test_kvcache_appends_to_pages_and_indexed_entries(layout, seqlen_q, rng):
    dtype, d_head, heads, batch = torch.bfloat16, 128, (8, 2), 3
    k_dense, v_dense = (helpers.random_tensor((batch, 640, heads[1], d_head), dtype, rng) for _ in range(2))
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, seqlen_q, heads[1], d_head), dtype, rng) for _ in range(2))
    cache_seqlens = torch.tensor([0, 600, 255], dtype=torch.int32, device="cuda")
    if layout == "paged":
        pages = _paged(k_dense, v_dense, 16, rng)
        k_cache, v_cache, keywords = pages.k, pages.v, dict(block_table=pages.block_table)
        read_back = lambda pool: _dense(pages, pool)  # noqa: E731
    else:
        index = torch.tensor([1, 3, 0], dtype=torch.int32, device="cuda")
        k_cache, v_cache = (helpers.random_tensor((4, 640, heads[1], d_head), dtype, rng) for _ in range(2))
        k_cache[index.long()], v_cache[index.long()] = k_dense, v_dense
        keywords = dict(cache_batch_idx=index)
        read_back = lambda cache: cache[index.long()]  # noqa: E731
    out = flash_attention.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=cache_seqlens, causal=True, **keywords
    )
    for b, start in enumerate(cache_seqlens.tolist()):
        k_dense[b, start : start + seqlen_q], v_dense[b, start : start + seqlen_q] = k_new[b], v_new[b]
    assert torch.equal(read_back(k_cache), k_dense) and torch.equal(read_back(v_cache), v_dense), "appended rows misplaced"
    helpers.assert_matches_reference(out, q, k_dense, v_dense, causal=True, seqused_k=cache_seqlens + seqlen_q)


def test_paged_and_indexed_calls_are_checked(rng):
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128, batch=2, seqlen_k=64)
    table = torch.zeros((2, 4), dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="^k: a paged cache is .* page_size a multiple of 16"):
        flash_attention.forward(None, q, k[:, :8], v[:, :8], block_table=table)
    with pytest.raises(TypeError, match="^block_table: dtype must be int32"):
        flash_attention.forward(None, q, k, v, block_table=table.long())
    with pytest.raises(ValueError, match="^block_table: shape"):
        flash_attention.forward(None, q, k, v, block_table=table[:1])
    with pytest.raises(ValueError, match="^leftpad_k: is not given with block_table"):
        flash_attention.forward(None, q, k, v, block_table=table, leftpad_k=table[:, 0])
    with pytest.raises(ValueError, match="^kv_batch_idx: is not given with block_table"):
        flash_attention.forward(None, q, k, v, block_table=table, kv_batch_idx=table[:, 0])
    with pytest.raises(ValueError, match="^kv_batch_idx: shape"):
        flash_attention.forward(None, q, k, v, kv_batch_idx=table[0])


def test_the_debug_check_names_pages_and_entries_past_the_cache(rng, monkeypatch):
    monkeypatch.setenv("FLASH_ATTENTION_CHECK_SEQLENS", "1")
    q, k, v = _decode_inputs(rng, torch.bfloat16, 128, batch=2, seqlen_k=64)
    table = torch.tensor([[0, 1], [2, 9]], dtype=torch.int32, device="cuda")
    used = torch.tensor([40, 20], dtype=torch.int32, device="cuda")
    pool_k, pool_v = k.view(4, 32, *k.shape[2:]), v.view(4, 32, *v.shape[2:])
    with pytest.raises(ValueError, match="^block_table: entries must be in \\[0, 4\\) .* sequence 1 has 9"):
        flash_attention.forward(None, q, pool_k, pool_v, block_table=table)
    flash_attention.forward(None, q, pool_k, pool_v, block_table=table, seqused_k=used)  # column 1 unused
    with pytest.raises(ValueError, match="^kv_batch_idx: entries must be in \\[0, 2\\)"):
        flash_attention.forward(None, q, k, v, kv_batch_idx=torch.tensor([0, 2], dtype=torch.int32, device="cuda"))
