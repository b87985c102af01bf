"""flash_attn_with_kvcache with a float8_e4m3fn cache beside 16-bit queries: the append (the operator
flash_attention::append_to_cache) stores each new key (rotated first) and value divided by its
(batch, kv head) factor, rounded to the nearest even e4m3 value and saturated at +-448, and the
attention receives k_descale and v_descale.

GPU tests compare the appended rows bit for bit with torch's own quantisation (a float32 division,
a clamp to +-448, then torch's rounding to e4m3), on dense, indexed (cache_batch_idx) and paged
caches, and require every other row to keep its bits; they skip, with the reason, without a GPU or
a build. CPU tests cover the argument checks (raised before the device is looked at), the fake
implementation and the descales passed on to the attention.
"""

from __future__ import annotations

import importlib
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402

BUILT = helpers.extension_is_built()
if BUILT:
    import flash_attention

pytestmark = pytest.mark.skipif(not BUILT, reason=helpers.NOT_BUILT_REASON)
gpu = pytest.mark.gpu
E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def _quantized(values: torch.Tensor, descale: torch.Tensor | None) -> torch.Tensor:
    """torch's quantisation of (batch, n, heads_kv, d) float32 values by (batch, heads_kv) factors
    (None: 1), as uint8 bit patterns: value / factor, clamped to +-448 (torch's own rounding makes
    NaN of what lies past it), rounded to the nearest even e4m3 value."""
    if descale is not None:
        values = values / descale[:, None, :, None]
    return values.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).view(torch.uint8)


def _rotated_float32(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, interleaved: bool):
    """x (batch, n, heads, d) with its first rotary_dim columns rotated at positions (batch, n), in
    float32 as the append computes it: each product rounded, then their sum or difference."""
    half = cos.shape[1]
    x = x.float()
    c = cos.float()[positions][:, :, None, :]
    s = sin.float()[positions][:, :, None, :]
    first, second = (x[..., 0 : 2 * half : 2], x[..., 1 : 2 * half : 2]) if interleaved else (x[..., :half], x[..., half : 2 * half])
    pair = (first * c - second * s, first * s + second * c)
    rotated = torch.stack(pair, dim=-1).flatten(-2) if interleaved else torch.cat(pair, dim=-1)
    return torch.cat((rotated, x[..., 2 * half :]), dim=-1)


def _factors(kind: str, batch: int, heads_kv: int, rng) -> torch.Tensor | None:
    """Dequantisation factors of one kind: none (factors of 1), per_head (one of its own per (batch,
    kv head), from 2^-9 to 2^6: some rows saturate, some round to e4m3's subnormals) or transposed
    (as per_head, stored (heads_kv, batch): other strides)."""
    if kind == "none":
        return None
    shape = (batch, heads_kv) if kind == "per_head" else (heads_kv, batch)
    factors = torch.exp2(torch.rand(shape, generator=rng, device="cuda") * 15 - 9)
    return factors if kind == "per_head" else factors.t()


def _cache_layout(layout: str, batch: int, capacity: int, heads_kv: int, d_head: int, rng) -> dict:
    """An e4m3 cache of random values holding `capacity` rows per sequence: its k_cache and v_cache,
    the call's keywords, and where sequence b's row j lies (entry, row of the entry)."""
    if layout == "dense":
        caches = [helpers.random_tensor((batch, capacity, heads_kv, d_head), E4M3, rng) for _ in range(2)]
        return dict(caches=caches, keywords={}, place=lambda b, j: (b, j))
    if layout == "indexed":
        caches = [helpers.random_tensor((batch + 2, capacity, heads_kv, d_head), E4M3, rng) for _ in range(2)]
        index = torch.randperm(batch + 2, generator=rng, device="cuda")[:batch].int()
        entries = index.tolist()
        return dict(caches=caches, keywords=dict(cache_batch_idx=index), place=lambda b, j: (entries[b], j))
    page_size = 16
    rows = [helpers.random_tensor((capacity, heads_kv, d_head), E4M3, rng) for _ in range(2 * batch)]
    pages = helpers.PagedCache.of(rows[:batch], rows[batch:], page_size, rng)
    table = pages.block_table.tolist()
    place = lambda b, j: (table[b][j // page_size], j % page_size)  # noqa: E731
    return dict(caches=[pages.k, pages.v], keywords=dict(block_table=pages.block_table), place=place)


def _append(path: str, q, k_cache, v_cache, k, v, seqlens, keywords, rotary, descales):
    """The append alone, through the plain call (`eager`, _C.append_to_cache) or the operator."""
    cos, sin, interleaved = rotary if rotary is not None else (None, None, True)
    arguments = (
        q, k_cache, v_cache, k, v, seqlens, keywords.get("cache_batch_idx"), keywords.get("block_table"), cos, sin,
        interleaved, True,
    )  # fmt: skip
    call = flash_attention._C.append_to_cache if path == "eager" else torch.ops.flash_attention.append_to_cache
    return call(*arguments, **descales)


@gpu
@pytest.mark.parametrize("path", ["eager", "operator"])
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("descale_kind", ["none", "per_head", "transposed"])
@pytest.mark.parametrize("layout", ["dense", "indexed", "paged"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_appended_rows_are_torchs_quantisation_bit_for_bit(dtype, layout, descale_kind, rotary, path, rng):
    """Each new row, rotated in float32 where rotary is given, divided by its head's factor and
    rounded to e4m3 as torch rounds it; every other row of the cache keeps its bits, and q is rotated
    as beside a 16-bit cache."""
    batch, seqlen_new, (heads_q, heads_kv), d_head, capacity = 3, 5, (8, 2), 64, 80
    cache = _cache_layout(layout, batch, capacity, heads_kv, d_head, rng)
    k_cache, v_cache = cache["caches"]
    q = helpers.random_tensor((batch, seqlen_new, heads_q, d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, seqlen_new, heads_kv, d_head), dtype, rng) for _ in range(2))
    seqlens = torch.tensor([0, 37, capacity - seqlen_new], dtype=torch.int32, device="cuda")
    factors = {name: _factors(descale_kind, batch, heads_kv, rng) for name in ("k_descale", "v_descale")}
    descales = {name: value for name, value in factors.items() if value is not None}
    positions = seqlens.long()[:, None] + torch.arange(seqlen_new, device="cuda")
    keys = k_new.float()
    table = None
    if rotary is not None:
        angles = torch.rand((capacity, 16), generator=rng, device="cuda") * 2 * math.pi
        table = (angles.cos(), angles.sin(), rotary == "interleaved")
        keys = _rotated_float32(k_new, *table[:2], positions, table[2])
    expected = [t.view(torch.uint8).clone() for t in (k_cache, v_cache)]
    new_rows = [_quantized(keys, factors["k_descale"]), _quantized(v_new.float(), factors["v_descale"])]
    for b, start in enumerate(seqlens.tolist()):
        for i in range(seqlen_new):
            entry, row = cache["place"](b, start + i)
            for bits, rows in zip(expected, new_rows, strict=True):
                bits[entry, row] = rows[b, i]

    rotated = _append(path, q, k_cache, v_cache, k_new, v_new, seqlens, cache["keywords"], table, descales)
    for name, cache_tensor, bits in zip(("k_cache", "v_cache"), (k_cache, v_cache), expected, strict=True):
        differ = (cache_tensor.view(torch.uint8) != bits).nonzero()
        assert differ.numel() == 0, f"{name}: {len(differ)} elements differ from torch's, the first at {differ[0].tolist()}"
    if rotary is not None:
        sixteen_bit = [t.float().to(dtype) for t in (k_cache, v_cache)]
        alone = _append(path, q, *sixteen_bit, k_new, v_new, seqlens, cache["keywords"], table, {})
        assert torch.equal(rotated, alone), "q is rotated otherwise beside an e4m3 cache"


@gpu
def test_infinities_saturate_and_nan_stays_nan(rng):
    """Values past +-448 (infinities too) are stored as +-448, tiny ones as e4m3's subnormals or
    zero (its sign kept), and NaN as NaN."""
    batch, heads_kv, d_head = 2, 2, 32
    k_cache, v_cache = (helpers.random_tensor((batch, 8, heads_kv, d_head), E4M3, rng) for _ in range(2))
    q = helpers.random_tensor((batch, 1, 4, d_head), torch.bfloat16, rng)
    k_new, v_new = (helpers.random_tensor((batch, 1, heads_kv, d_head), torch.bfloat16, rng) for _ in range(2))
    special = torch.tensor([math.inf, -math.inf, 1e5, -500.0, 460.0, 1e-3, -1e-3, 2.0**-10, -(2.0**-12)])
    k_new[0, 0, 0, : len(special)] = special.to(torch.bfloat16)
    k_new[1, 0, 1, 3] = math.nan
    seqlens = torch.tensor([2, 5], dtype=torch.int32, device="cuda")
    flash_attention._C.append_to_cache(q, k_cache, v_cache, k_new, v_new, seqlens, None, None, None, None, True, True)
    stored = k_cache.view(torch.uint8)[[0, 1], [2, 5]]
    expected = _quantized(k_new.float(), None)[:, 0]
    nan = k_new[:, 0].isnan()
    assert torch.equal(stored[~nan], expected[~nan]), "finite and infinite values stored otherwise than torch's"
    assert k_cache[1, 5, 1, 3].float().isnan(), "NaN is not stored as NaN"
    assert torch.equal(k_cache[0, 2, 0, :5].float().cpu(), torch.tensor([448.0, -448.0, 448.0, -448.0, 448.0]))


@gpu
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_a_step_passes_the_descales_to_its_attention(layout, rng):
    """flash_attn_with_kvcache with an e4m3 cache: the caches after the step are those of the append
    alone, and its output the bits of forward on those caches with the same descales."""
    dtype, batch, seqlen_new, (heads_q, heads_kv), d_head, capacity = torch.bfloat16, 2, 1, (8, 2), 128, 512
    cache = _cache_layout(layout, batch, capacity, heads_kv, d_head, rng)
    k_cache, v_cache = cache["caches"]
    q = helpers.random_tensor((batch, seqlen_new, heads_q, d_head), dtype, rng)
    k_new, v_new = (helpers.random_tensor((batch, seqlen_new, heads_kv, d_head), dtype, rng) for _ in range(2))
    seqlens = torch.tensor([100, 300], dtype=torch.int32, device="cuda")
    descales = {name: _factors("per_head", batch, heads_kv, rng) for name in ("k_descale", "v_descale")}
    appended = [t.clone() for t in (k_cache, v_cache)]
    _append("eager", q, *appended, k_new, v_new, seqlens, cache["keywords"], None, descales)

    out = flash_attention.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens, causal=True, **cache["keywords"], **descales
    )
    for name, ours, alone in zip(("k_cache", "v_cache"), (k_cache, v_cache), appended, strict=True):
        assert torch.equal(ours.view(torch.uint8), alone.view(torch.uint8)), f"{name}: the step wrote other bits"
    expected = flash_attention.forward(
        None, q, k_cache, v_cache, causal=True, seqused_k=seqlens + seqlen_new, **cache["keywords"], **descales
    )
    assert out.dtype == dtype and torch.equal(out, expected), "the step's attention differs from forward's with its descales"


# ----------------------------------------------------------------------------------------------
# CPU: the checks, the fake implementation and the descales passed on


def _cpu_step(d_head: int = 64):
    """q, an e4m3 cache and new rows on the CPU (the checks run before the device is looked at)."""
    q = torch.randn(2, 1, 8, d_head).half()
    cache = torch.randn(2, 32, 2, d_head).to(E4M3)
    new = torch.randn(2, 1, 2, d_head).half()
    return q, cache, new


def test_the_quantised_append_checks_its_arguments_before_any_launch():
    """Each rule, on the plain call and through the operator: the message names the argument."""
    q, cache, new = _cpu_step()
    q_72, cache_72, new_72 = _cpu_step(72)
    factors = torch.rand(2, 2) + 0.5
    half_cache = cache.half()
    misaligned = torch.empty(cache.numel() + 16, dtype=E4M3)[8 : 8 + cache.numel()].view(cache.shape)
    misaligned.copy_(cache)
    wide = torch.randn(2, 32, 2, 72).to(E4M3)[..., :64]  # head stride 72: not a 16-byte multiple
    cases = [
        ((q, cache, half_cache, new, new), {}, TypeError, r"^k_cache, v_cache: both float8_e4m3fn or neither, got float8_e4m3fn and float16"),
        ((q, half_cache, cache, new, new), {}, TypeError, r"^k_cache, v_cache: both float8_e4m3fn or neither, got float16 and float8_e4m3fn"),
        ((q.to(E4M3), cache, cache, new, new), {}, TypeError, r"^q: a float8_e4m3fn cache takes float16 or bfloat16 queries"),
        ((q.to(E4M3), half_cache, half_cache, new, new), {}, NotImplementedError, r"^q: float8_e4m3fn inputs are not appended to a cache"),
        ((q, cache, cache, new.to(E4M3), new.to(E4M3)), {}, ValueError, r"^k: Float8_e4m3fn on cpu, q is Half on cpu"),
        ((q, cache, cache, new, new.bfloat16()), {}, ValueError, r"^v: BFloat16 on cpu, q is Half on cpu"),
        ((q, cache.float(), cache.float(), new, new), {}, ValueError, r"^k_cache: Float on cpu, q is Half on cpu \(a cache holds q's dtype or float8_e4m3fn\)"),
        ((q, half_cache, half_cache, new, new), {"k_descale": factors}, ValueError, r"^k_descale: descales apply to float8_e4m3fn inputs only; k_cache is float16"),
        ((q, half_cache, half_cache, new, new), {"v_descale": factors}, ValueError, r"^v_descale: descales apply to float8_e4m3fn inputs only; v_cache is float16"),
        ((q, cache, cache, new, new), {"k_descale": factors.double()}, TypeError, r"^k_descale: dtype must be float32, got Double"),
        ((q, cache, cache, new, new), {"v_descale": factors[:, :1]}, ValueError, r"^v_descale: shape \[2, 1\] must be \(batch, heads_kv\) = \(2, 2\)"),
        ((q, cache, cache, new, new), {"k_descale": factors[0]}, ValueError, r"^k_descale: shape \[2\] must be \(batch, heads_kv\) = \(2, 2\)"),
        ((q_72, cache_72, cache_72, new_72, new_72), {}, ValueError, r"^k_cache: a float8_e4m3fn cache's rows are read in 16-byte chunks, so d_head must be a multiple of 16, got 72"),
        ((q, wide, wide, new, new), {}, ValueError, r"^k_cache: .* its batch, seq and head strides must be multiples of 16 elements, got strides 4608, 144, 72"),
        ((q, cache, wide, new, new), {}, ValueError, r"^v_cache: .* its batch, seq and head strides must be multiples of 16"),
        ((q, misaligned, misaligned, new, new), {}, ValueError, r"^k_cache: .* its data pointer must be 16-byte aligned"),
        # Every rule met (transposed factors: any strides): the device is the last one looked at.
        ((q, cache, cache, new, new), {"k_descale": factors, "v_descale": factors.t().contiguous().t()}, ValueError, r"^q: expected a CUDA tensor, got a tensor on cpu"),
    ]  # fmt: skip
    for (q_, k_cache, v_cache, k, v), descales, error, message in cases:
        with pytest.raises(error, match=message):
            flash_attention.flash_attn_with_kvcache(q_, k_cache, v_cache, k, v, cache_seqlens=3, **descales)
        with pytest.raises(error, match=message):
            torch.ops.flash_attention.append_to_cache(
                q_, k_cache, v_cache, k, v, torch.full((2,), 3, dtype=torch.int32), None, None, None, None, True, True,
                **descales,
            )


def test_descales_are_checked_for_their_type_and_device():
    q, cache, new = _cpu_step()
    with pytest.raises(TypeError, match=r"^k_descale: expected a torch.Tensor or None, got float"):
        flash_attention.flash_attn_with_kvcache(q, cache, cache, new, new, cache_seqlens=3, k_descale=1.0)
    with pytest.raises(ValueError, match=r"^v_descale: is on meta but q is on cpu"):
        flash_attention.flash_attn_with_kvcache(
            q, cache, cache, new, new, cache_seqlens=3, v_descale=torch.empty(2, 2, device="meta")
        )


def test_the_fake_implementation_takes_the_descales():
    """Under fake tensors (torch.compile's tracing) the operator returns what the call would: q's
    shape rotated, an empty tensor without rotary."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, cache, new = _cpu_step()
        factors, angles, seqlens = torch.ones(2, 2), torch.rand(32, 16), torch.zeros(2, dtype=torch.int32)
        append = torch.ops.flash_attention.append_to_cache
        rotated = append(q, cache, cache, new, new, seqlens, None, None, angles, angles, True, True, k_descale=factors, v_descale=factors)
        plain = append(q, cache, cache, new, new, seqlens, None, None, None, None, True, True, v_descale=factors)
    assert (tuple(rotated.shape), rotated.dtype) == (tuple(q.shape), q.dtype)
    assert tuple(plain.shape) == (0,)


@pytest.mark.parametrize(
    "given", [(), ("k_descale",), ("v_descale",), ("k_descale", "v_descale")], ids=["none", "k", "v", "both"]
)
def test_the_attention_receives_the_descales_given(given, monkeypatch):
    """flash_attn_with_kvcache hands the attention fp8={the descales given}, and fp8=None where none
    is (a step without new rows: nothing runs before the attention)."""
    kvcache = importlib.import_module("flash_attention.kvcache")
    received = {}
    monkeypatch.setattr(kvcache, "_attention", lambda *args, **keywords: received.update(keywords))
    q, cache, _ = _cpu_step()
    descales = {name: torch.rand(2, 2) + 0.5 for name in given}
    flash_attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3, **descales)
    if not given:
        assert received["fp8"] is None
    else:
        assert received["fp8"].keys() == descales.keys()
        assert all(received["fp8"][name] is descales[name] for name in given)
