"""Head sizes the build has no configuration of: every multiple of 8 from 8 to 256, and sizes that
are not (59, 111), against the float32 reference. A call runs at the smallest compiled head size
that holds its own, reading and writing the call's columns in place (the Hopper family's tensor
maps end there; the SM80 family runs it with masked tails, whose copies predicate the columns); a
size that is not a multiple of 8 runs on copies padded with zero columns. The softmax scale stays
the call's, 1/sqrt(d_head). GPU tests: they skip, with the reason, without a
GPU or a build.
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

# Every multiple of 8, and FlashAttention-2's test sizes that are not one.
HEAD_SIZES = [*range(8, 257, 8), 59, 111]


def _inputs(rng, d_head, dtype=torch.bfloat16, batch=2, seqlen_q=133, seqlen_k=197, heads=(4, 2)):
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    k, v = (helpers.random_tensor((batch, seqlen_k, heads[1], d_head), dtype, rng) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("causal", [False, True], ids=["none", "causal"])
@pytest.mark.parametrize("d_head", HEAD_SIZES)
def test_every_head_size_matches_the_reference(d_head, causal, rng):
    q, k, v = _inputs(rng, d_head)
    out, lse, _ = flash_attention.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape
    reference = helpers.assert_matches_reference(out, q, k, v, causal=causal)
    helpers.assert_lse_matches(lse, reference)
    assert torch.equal(flash_attention.flash_attn_func(q, k, v, causal=causal), out), "repeated calls differ"


@pytest.mark.parametrize("d_head", [40, 80, 160, 224])
def test_the_default_scale_is_the_call_s_head_size(d_head, rng):
    q, k, v = _inputs(rng, d_head)
    default = flash_attention.flash_attn_func(q, k, v)
    # 1 / sqrt(d_head) in float32, as the extension computes it.
    scale = (torch.tensor(1.0) / torch.tensor(float(d_head)).sqrt()).item()
    explicit = flash_attention.flash_attn_func(q, k, v, softmax_scale=scale)
    assert torch.equal(default, explicit)


def _smallest_configs_holding(d_head, dtype):
    """Per family under test, its configuration of the smallest head size at least d_head."""
    configs = {}
    for cfg in helpers.configs_under_test():
        if cfg.dtype.to_torch_dtype() == dtype and cfg.d_head >= d_head:
            best = configs.get(cfg.family)
            if best is None or cfg.d_head < best.d_head:
                configs[cfg.family] = cfg
    if not configs:
        pytest.skip(f"no {dtype} configuration of d_head >= {d_head} under test")
    return configs.values()


@pytest.mark.parametrize("lengths", [(133, 197), (256, 256)], ids=["ragged", "whole_blocks"])
@pytest.mark.parametrize("d_head", [24, 80, 59])
def test_each_family_serves_a_smaller_head_size(d_head, lengths, rng):
    """Explicit configurations of a larger head size, of each family compiled, at lengths with and
    without partial blocks (the SM80 family runs a smaller head size with masked tails either way);
    the columns past the call's are never written."""
    q, k, v = _inputs(rng, d_head, dtype=torch.float16, seqlen_q=lengths[0], seqlen_k=lengths[1])
    for cfg in _smallest_configs_holding(d_head, torch.float16):
        out = flash_attention.forward(cfg, q, k, v, helpers.nan_like(q), causal=True)
        helpers.assert_matches_reference(out, q, k, v, causal=True)
        assert torch.equal(flash_attention.forward(cfg, q, k, v, causal=True), out)


@pytest.mark.parametrize("d_head", [24, 80])
def test_a_multiple_of_8_runs_without_copies_of_the_inputs(d_head, rng):
    """Each family reads and writes a smaller head size in place: the call allocates its output and
    nothing the size of q, k or v besides."""
    q, k, v = _inputs(rng, d_head, dtype=torch.float16, seqlen_q=256, seqlen_k=256)
    for cfg in _smallest_configs_holding(d_head, torch.float16):
        flash_attention.forward(cfg, q, k, v)  # any one-time allocation happens here
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = flash_attention.forward(cfg, q, k, v)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
        assert extra < 2 * out.nbytes, f"{cfg}: {extra} bytes allocated for an output of {out.nbytes}"


@pytest.mark.parametrize("d_head", [48, 80, 59])
def test_varlen_and_sdpa_at_other_head_sizes(d_head, rng):
    lengths = [0, 1, 130, 77]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    total = sum(lengths)
    q = helpers.random_tensor((total, 4, d_head), torch.bfloat16, rng)
    k, v = (helpers.random_tensor((total, 2, d_head), torch.bfloat16, rng) for _ in range(2))
    out = flash_attention.flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths), causal=True)
    assert out.shape == q.shape
    helpers.assert_matches_reference(
        out, q, k, v, causal=True, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max(lengths),
        max_seqlen_k=max(lengths),
    )

    query, key, value = (t.transpose(1, 2) for t in _inputs(rng, d_head, heads=(4, 4)))
    ours = flash_attention.scaled_dot_product_attention(query, key, value, is_causal=True)
    theirs = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True)
    torch.testing.assert_close(ours, theirs, atol=2e-2, rtol=2e-2)


def test_a_head_size_past_every_configuration_raises(rng):
    q, k, v = _inputs(rng, 264)
    with pytest.raises(ValueError, match="^q: no configuration compiled into this build"):
        flash_attention.flash_attn_func(q, k, v)


def test_an_o_given_for_a_padded_head_size_is_checked_and_written(rng):
    """A head size run on padded copies (59) writes the call's columns into a given o, after the
    same checks a given o always gets."""
    q, k, v = _inputs(rng, 59)
    cfg = flash_attention.choose_config(q, k).config
    out = flash_attention.forward(cfg, q, k, v, helpers.nan_like(q))
    helpers.assert_matches_reference(out, q, k, v)
    with pytest.raises(ValueError, match="^o: shape"):
        flash_attention.forward(cfg, q, k, v, helpers.nan_like(q)[:, :-1])


def test_forward_timed_takes_the_per_sequence_keywords(rng):
    lengths = [5, 130, 77]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q, k, v = (helpers.random_tensor((sum(lengths), 4, 64), torch.bfloat16, rng) for _ in range(3))
    keywords = dict(cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=130, max_seqlen_k=130, causal=True)
    cfg = flash_attention.choose_config(q, k, **keywords).config
    out, runtime_ms = flash_attention.forward_timed(cfg, q, k, v, **keywords)
    assert runtime_ms > 0
    assert torch.equal(out, flash_attention.forward(cfg, q, k, v, **keywords))
