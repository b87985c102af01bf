"""The drop-in API: FlashAttention-2's entry points, the SDPA-shaped function, automatic
configuration (the dispatch table and the rule), the torch operators (fake implementations,
opcheck, torch.compile without graph breaks, CUDA graphs) and the error for a missing backward.

Outputs are compared with the float32 reference and the criterion of the other tests; GPU tests
carry the ``gpu`` marker and skip, with the reason, without a GPU or a build.
"""

from __future__ import annotations

import random
import re

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: these tests need it")

import helpers  # noqa: E402
from flash_helpers.dispatch_table import DispatchTable, TableEntry, arch_name  # noqa: E402
from flash_helpers.problem import MaskKind, ProblemVariant, mask_kind  # noqa: E402

pytestmark = pytest.mark.skipif(not helpers.extension_is_built(), reason="flash_attention._C is not built")

if helpers.extension_is_built():
    import flash_attention
    from flash_attention import dispatch

FP16_D128 = "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax"


def _meta(shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ----------------------------------------------------------------------------------------------
# The dispatch table and automatic configuration (no GPU needed: meta tensors and an arch name)


def _table(*ranked_lists) -> DispatchTable:
    """Entries of FP16 d_head 128 without a mask: (seq_len, [configuration, ...]) with times 1, 2, ...
    ms, or (seq_len, [configuration, ...], [time, ...])."""
    entries = []
    for seq, ranked, *times in ranked_lists:
        times = tuple(times[0]) if times else tuple(float(place) for place in range(1, len(ranked) + 1))
        entries.append(TableEntry("FP16", 128, False, seq, tuple(ranked), times))
    return DispatchTable.from_rankings("sm_90", "test GPU", "2026-01-01", "made by hand", entries)


def test_table_round_trips_through_json():
    table = _table((1024, ["a", "b"], [0.25, 0.5]), (512, ["c"]))
    assert DispatchTable.from_json(table.to_json()) == table
    assert [e.seq_len for e in table.entries] == [512, 1024], "entries are sorted"


def test_table_refuses_another_format():
    text = _table((512, ["a"])).to_json().replace('"format_version": 2', '"format_version": 99')
    with pytest.raises(ValueError, match="format"):
        DispatchTable.from_json(text)


def test_table_entry_needs_a_time_per_configuration_fastest_first():
    with pytest.raises(ValueError, match="2 ranked configurations but 1 times"):
        TableEntry("FP16", 128, False, 512, ("a", "b"), (1.0,))
    with pytest.raises(ValueError, match="fastest first"):
        TableEntry("FP16", 128, False, 512, ("a", "b"), (2.0, 1.0))


@pytest.mark.parametrize("seqlen_q, measured", [(1, 512), (512, 512), (513, 1024), (1000, 1024), (5000, 1024)])
def test_table_entry_is_the_next_measured_length_up(seqlen_q, measured):
    table = _table((512, ["a"]), (1024, ["b"]))
    assert table.entry_for("FP16", 128, False, seqlen_q).seq_len == measured
    assert table.entry_for("FP16", 128, True, seqlen_q) is None
    assert table.entry_for("BF16", 128, False, seqlen_q) is None


def test_arch_name():
    assert arch_name((9, 0)) == "sm_90" and arch_name((8, 6)) == "sm_86"


def test_every_shipped_table_names_valid_configurations():
    tables = sorted(dispatch.TABLES_DIR.glob("*.json"))
    for path in tables:
        table = DispatchTable.load(path)
        assert path.stem == table.arch
        for entry in table.entries:
            assert entry.ranked, f"{path.name}: an entry ranks nothing"
            for short_form in entry.ranked:
                assert _parse(short_form).is_valid(), f"{path.name}: {short_form} is not valid"


def _parse(short_form):
    from flash_helpers.kernel_names import parse_kernel_name_into_config

    return parse_kernel_name_into_config(short_form)


@pytest.fixture
def with_table():
    """Installs a dispatch table made by the test (None: no table at all) for its duration, then the
    shipped tables again."""
    dispatch.load_dispatch_tables()
    yield lambda table: dispatch.install_dispatch_tables([] if table is None else [table])
    dispatch.load_dispatch_tables.cache_clear()
    dispatch.load_dispatch_tables()


def _visited_tiles_by_brute_force(B_r, B_c, seqlen_q, seqlen_k, causal, window_size):
    """The tiles holding at least one key that some row of a query block may attend, the block's
    rows past seqlen_q included (the kernels' blocks reach as far as their B_r rows would)."""
    left, right = window_size
    if causal:
        right = 0
    if mask_kind(seqlen_q, seqlen_k, causal, window_size) == MaskKind.NONE:
        left = right = -1
    total = 0
    for block in range(-(-seqlen_q // B_r)):
        tiles = set()
        for row in range(block * B_r, (block + 1) * B_r):
            diagonal = row + seqlen_k - seqlen_q
            lo = 0 if left < 0 else max(0, diagonal - left)
            hi = seqlen_k - 1 if right < 0 else min(seqlen_k - 1, diagonal + right)
            tiles.update(range(lo // B_c, hi // B_c + 1) if lo <= hi else ())
        total += len(tiles)
    return total


def test_visited_tiles_are_the_tiles_some_row_of_a_block_attends():
    rng = random.Random(7)
    for _ in range(400):
        B_r, B_c = rng.choice((64, 128, 192)), rng.choice((32, 64, 112, 128, 144, 176))
        seqlen_q, seqlen_k = rng.randint(1, 700), rng.randint(1, 700)
        causal = rng.random() < 0.4
        window = (rng.choice((-1, rng.randint(0, 300))), rng.choice((-1, rng.randint(0, 300))))
        expected = _visited_tiles_by_brute_force(B_r, B_c, seqlen_q, seqlen_k, causal, window)
        args = (B_r, B_c, seqlen_q, seqlen_k, causal, window)
        assert flash_attention._C.visited_tiles(*args) == expected, args


def test_visited_tiles_of_whole_and_partial_blocks():
    assert flash_attention._C.visited_tiles(128, 128, 1024, 1024) == 64
    assert flash_attention._C.visited_tiles(128, 128, 1024, 1024, True) == 36  # 8 blocks visit 1 .. 8 tiles
    assert flash_attention._C.visited_tiles(128, 144, 1000, 1000) == 8 * 7  # 1008 keys in 144-key tiles
    assert flash_attention._C.visited_tiles(128, 128, 1, 4096, True) == 32  # one query row attends every key


def test_choice_follows_the_table_skipping_what_is_not_compiled(with_table):
    compiled = [
        c
        for c in flash_attention.compiled_configs()
        if c.dtype.name == "FP16" and c.d_head == 128 and not c.needs_masked_tails(4096, 4096)
    ]
    if not compiled:
        pytest.skip("no FP16 d_head 128 configuration for whole blocks of 4096 compiled")
    missing = "(FP16, 128, 64, 32, 4): load_0_1_1_tiles"
    assert _parse(missing) not in flash_attention.compiled_configs()
    with_table(_table((4096, [missing, compiled[-1].short_form()])))
    q = _meta((2, 4096, 8, 128))
    choice = flash_attention.choose_config(q, q, arch="sm_90")
    assert choice.config == compiled[-1]
    assert "dispatch table" in choice.reason and "place 2 of 2" in choice.reason


def test_choice_keeps_a_vtcopy_block_for_a_head_below_its_own(with_table):
    """V's transposed copy is laid out at the call's d_head: ranked first, the vtcopy block serves its own
    head size and a smaller one that its size serves (96 on 128), as the transposing blocks do."""
    copy = _parse("sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent+vtcopy")
    twin = _parse("sm90(E4M3, 128, 128, 192, 2): ws+pingpong+overlap+persistent")
    compiled = flash_attention.compiled_configs()
    if copy not in compiled or twin not in compiled:
        pytest.skip(f"needs {copy.short_form()} and {twin.short_form()} compiled (the default set with 9.0)")
    entry = TableEntry("E4M3", 128, False, 4096, (copy.short_form(), twin.short_form()), (1.0, 2.0))
    with_table(DispatchTable.from_rankings("sm_90", "test GPU", "2026-01-01", "made by hand", [entry]))

    def chosen(d_head):
        q = _meta((2, 4096, 8, d_head), torch.float8_e4m3fn)
        return flash_attention.choose_config(q, q, arch="sm_90").config

    assert chosen(128) == copy
    assert chosen(96) == copy


def test_choice_scales_the_tables_times_by_the_tiles_each_configuration_visits(with_table):
    # 1000 keys fill 8 tiles of 128 (1024 keys) but 7 of 144 (1008): measured 5% slower at 1024, the
    # 144-key configuration does 7/8 of its work there at 1000.
    wide, narrow = (
        _parse(f"sm90(FP16, 128, 128, {B_c}, 2): ws+pingpong+overlap+persistent") for B_c in (128, 144)
    )
    compiled = flash_attention.compiled_configs()
    if wide not in compiled or narrow not in compiled:
        pytest.skip(f"needs {wide.short_form()} and {narrow.short_form()} compiled (the default set with 9.0)")
    with_table(_table((1024, [wide.short_form(), narrow.short_form()], [1.0, 1.05])))
    at = lambda seqlen_q, seqlen_k=None, **kw: flash_attention.choose_config(  # noqa: E731
        _meta((2, seqlen_q, 8, 128)), _meta((2, seqlen_k or seqlen_q, 8, 128)), arch="sm_90", **kw
    )
    assert at(1024).config == wide, "at the measured length, the table's order"
    choice = at(1000)
    assert choice.config == narrow and "place 2 of 2" in choice.reason and "tiles each configuration visits" in choice.reason
    assert at(1000, 1024).config == wide, "the query length alone leaves both with 8 of 8 tiles per block"
    assert at(1024, 1000).config == narrow
    assert at(4096, 4000).config == narrow  # 28 tiles of 144 against 32 of 128: 0.92 against 1.0


def _bf16_d128_decoding_configs() -> dict:
    """The compiled bf16 decoding configurations of d_head 128 by their rows per block
    (DECODE_KERNELS: SM80, 16 rows whose warps split the keys and 64 rows, varlen variants); skips
    the test where they are not both there, or no sm_90 machine code to choose for."""
    decoding = {
        c.B_r: c for c in flash_attention.compiled_configs()
        if c.family == "sm80" and c.dtype.name == "BF16" and c.d_head == 128 and c.B_r <= 64
        and any(v.varlen for v in flash_attention.compiled_variants(c))
    }
    if set(decoding) != {16, 64} or 90 not in [a // 10 for a in flash_attention._C.compiled_architectures()]:
        pytest.skip("needs the decoding configurations (DECODE_KERNELS) compiled for sm_90")
    return decoding


def test_choice_reports_the_split_a_decoding_call_runs():
    """One query against a long cache: the split heuristic's configuration and count, as the call
    runs them (packed heads: 32 query heads over 8, 4 rows: the 16-row blocks); unknown without a
    multiprocessor count."""
    splitting = _bf16_d128_decoding_configs()
    q, k = _meta((1, 1, 32, 128), torch.bfloat16), _meta((1, 131072, 8, 128), torch.bfloat16)
    choice = flash_attention.choose_config(q, k, causal=True, arch="sm_90", multiprocessors=132)
    assert choice.config == splitting[16] and choice.variant.varlen
    assert choice.num_splits > 1 and "decoding" in choice.reason, choice
    # 8 query blocks: 32 splits fill 256 of the 264 slots (97%); 29, 232 of them (88%), are not kept.
    assert choice.num_splits == 32, choice
    unknown = flash_attention.choose_config(q, k, causal=True, arch="sm_90")
    assert unknown.num_splits is None and "whether the keys split unknown" in str(unknown)
    with pytest.raises(ValueError, match="^multiprocessors: expected a positive int"):
        flash_attention.choose_config(q, k, arch="sm_90", multiprocessors=0)


def test_a_decoding_call_that_does_not_split_runs_whole_on_the_decoding_configuration():
    """Many sequences fill the GPU unsplit: the decoding configuration still runs them (measured
    faster than the table's Hopper configurations there), whole; a longer query does not fit it."""
    decoding = _bf16_d128_decoding_configs()
    q, k = _meta((128, 1, 32, 128), torch.bfloat16), _meta((128, 2048, 8, 128), torch.bfloat16)
    choice = flash_attention.choose_config(q, k, causal=True, arch="sm_90", multiprocessors=132)
    assert choice.config == decoding[16] and choice.variant.varlen and choice.num_splits == 1, choice
    assert "decoding" in choice.reason and "1 split " in choice.reason, choice
    prefill = flash_attention.choose_config(_meta((128, 65, 32, 128), torch.bfloat16), k, causal=True, arch="sm_90",
                                            multiprocessors=132)
    assert prefill.config not in decoding.values(), prefill


def test_a_short_cache_runs_whole_and_splits_from_six_key_tiles():
    """Below six key tiles of 64 a split saves less than the combine costs: 256 keys (4 tiles) run
    whole on the decoding configuration, 384 (6 tiles) split."""
    decoding = _bf16_d128_decoding_configs()
    q = _meta((1, 1, 32, 128), torch.bfloat16)
    short = flash_attention.choose_config(q, _meta((1, 256, 8, 128), torch.bfloat16), causal=True, arch="sm_90",
                                          multiprocessors=132)
    assert short.config == decoding[16] and short.num_splits == 1, short
    longer = flash_attention.choose_config(q, _meta((1, 384, 8, 128), torch.bfloat16), causal=True, arch="sm_90",
                                           multiprocessors=132)
    assert longer.config == decoding[16] and longer.num_splits == 3, longer


def test_a_speculative_step_is_chosen_for_with_each_querys_heads_packed():
    """Four queries of 32 heads over 8: packed as 16 rows per key/value head, they fit a 16-row
    decoding block and keep the causal mask (each row's diagonal is its query's); one query needs no
    mask. Five queries (20 rows) take the 64-row block; five queries of 16 heads over 1 head (80
    rows) fit none."""
    decoding = _bf16_d128_decoding_configs()
    k = _meta((2, 8192, 8, 128), torch.bfloat16)
    four = flash_attention.choose_config(_meta((2, 4, 32, 128), torch.bfloat16), k, causal=True, arch="sm_90",
                                         multiprocessors=132)
    assert four.config == decoding[16] and four.variant.mask == MaskKind.CAUSAL and four.num_splits > 1, four
    one = flash_attention.choose_config(_meta((2, 1, 32, 128), torch.bfloat16), k, causal=True, arch="sm_90",
                                        multiprocessors=132)
    assert one.config == decoding[16] and one.variant.mask == MaskKind.NONE, one
    five = flash_attention.choose_config(_meta((2, 5, 32, 128), torch.bfloat16), k, causal=True, arch="sm_90",
                                         multiprocessors=132)
    assert five.config == decoding[64] and five.num_splits > 1, five
    wide = flash_attention.choose_config(_meta((2, 5, 16, 128), torch.bfloat16), _meta((2, 8192, 1, 128), torch.bfloat16),
                                         causal=True, arch="sm_90", multiprocessors=132)
    assert wide.config not in decoding.values(), wide


def test_choice_falls_back_to_the_default_set(with_table):
    with_table(None)
    cfg = flash_attention.compiled_configs()[0]
    # An architecture this build has machine code for, that the configuration's family runs on.
    arch = "sm_90" if cfg.family == "sm90" else f"sm_{min(flash_attention._C.compiled_architectures()) // 10}"
    q = _meta((2, 1000, 8, cfg.d_head), cfg.dtype.to_torch_dtype())
    choice = flash_attention.choose_config(q, q, causal=True, arch=arch)
    assert f"no dispatch table for {arch}" in choice.reason
    assert choice.variant == flash_attention.ProblemVariant(flash_attention.MaskKind.CAUSAL, True, False)
    assert choice.variant in flash_attention.compiled_variants(choice.config)


def test_choice_respects_the_architectures_shared_memory():
    big = [c for c in flash_attention.compiled_configs() if c.smem_bytes() > 101376]
    if not big:
        pytest.skip("every compiled configuration fits in sm_86's shared memory")
    cfg = big[0]
    q = _meta((1, 512, 2, cfg.d_head), cfg.dtype.to_torch_dtype())
    try:
        choice = flash_attention.choose_config(q, q, arch="sm_86")
    except ValueError as error:
        assert "no configuration compiled into this build" in str(error)
    else:
        assert choice.config.smem_bytes() <= 101376


def test_choice_rejects_what_no_kernel_runs():
    with pytest.raises(TypeError, match="q: dtype must be float16, bfloat16 or float8_e4m3fn, got Float"):
        flash_attention.choose_config(_meta((1, 8, 1, 64), torch.float32), _meta((1, 8, 1, 64)), arch="sm_90")
    with pytest.raises(ValueError, match="d_head 264"):
        flash_attention.choose_config(_meta((1, 8, 1, 264)), _meta((1, 8, 1, 264)), arch="sm_90")
    with pytest.raises(ValueError, match="arch"):
        flash_attention.choose_config(_meta((1, 8, 1, 64)), _meta((1, 8, 1, 64)), arch="ampere")
    with pytest.raises(ValueError, match="q: must be a CUDA tensor"):
        flash_attention.choose_config(torch.empty(1, 8, 1, 64, dtype=torch.float16), _meta((1, 8, 1, 64)))


def test_choice_serves_a_head_size_with_the_smallest_compiled_that_holds_it():
    served = {cfg.d_head for cfg in flash_attention.compiled_configs() if cfg.dtype.name == "FP16" and cfg.d_head >= 80}
    if not served:
        pytest.skip("no float16 configuration of d_head 80 or more compiled")
    choice = flash_attention.choose_config(_meta((1, 8, 1, 80)), _meta((1, 8, 1, 80)), arch="sm_90")
    assert choice.config.d_head == min(served)


def test_choice_checks_the_problem_as_a_call_does():
    q = _meta((1, 8, 6, 64))
    with pytest.raises(ValueError, match="k: heads_q"):
        flash_attention.choose_config(q, _meta((1, 8, 4, 64)), arch="sm_90")
    with pytest.raises(ValueError, match="window_size: left"):
        flash_attention.choose_config(q, q, window_size=(-3, 0), arch="sm_90")
    with pytest.raises(ValueError, match="softcap"):
        flash_attention.choose_config(q, q, softcap=-1.0, arch="sm_90")
    with pytest.raises(ValueError, match="alibi_slopes: shape"):
        flash_attention.choose_config(q, q, alibi_slopes=torch.ones(5), arch="sm_90")


def test_choice_says_what_an_architecture_lacks():
    q = _meta((1, 8, 1, 64))
    with pytest.raises(ValueError, match="need sm_80 or newer") as older:
        flash_attention.choose_config(q, q, arch="sm_75")
    assert "FLASH_BUILD_KERNELS" not in str(older.value), "no build helps a GPU older than every family"
    newest = max(flash_attention._C.compiled_architectures()) // 10
    newer = f"sm_{newest // 10 + 1}0"
    with pytest.raises(ValueError, match=f"machine code for .* only; rebuild with {newer} in TORCH_CUDA_ARCH_LIST"):
        flash_attention.choose_config(q, q, arch=newer)


def test_kernel_attributes_names_a_variant_that_is_not_compiled():
    cfg = flash_attention.compiled_configs()[0]
    with pytest.raises(TypeError, match="^variant: expected a ProblemVariant or None, got tuple"):
        flash_attention.kernel_attributes(cfg, (0, False, False, False, False))
    # An FP8 cache is read by varlen kernels alone: no configuration has this variant.
    never = ProblemVariant(kv_e4m3=True)
    with pytest.raises(ValueError, match=rf"^variant: no mask, e4m3 KV cache is not compiled for {re.escape(cfg.short_form())}"):
        flash_attention.kernel_attributes(cfg, never)
    with pytest.raises(ValueError, match="^variant: not compiled for "):
        flash_attention._C.kernel_attributes(cfg, (int(never.mask), *never.flags()))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message where no GPU is visible")
def test_kernel_attributes_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="needs a CUDA GPU, and none is visible"):
        flash_attention.kernel_attributes(flash_attention.compiled_configs()[0])


# ----------------------------------------------------------------------------------------------
# Arguments rejected before anything runs


def test_dropout_is_not_implemented():
    q = _meta((1, 8, 1, 64))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attention.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attention.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


def test_packed_shapes_are_checked():
    with pytest.raises(ValueError, match=r"qkv: expected a \(batch, seqlen, 3, heads, d\) tensor"):
        flash_attention.flash_attn_qkvpacked_func(_meta((1, 8, 2, 1, 64)))
    with pytest.raises(ValueError, match=r"kv: expected a \(batch, seqlen, 2, heads, d\) tensor"):
        flash_attention.flash_attn_kvpacked_func(_meta((1, 8, 1, 64)), _meta((1, 8, 3, 1, 64)))


def test_sdpa_rejects_grouped_heads_without_enable_gqa():
    with pytest.raises(ValueError, match="enable_gqa"):
        flash_attention.scaled_dot_product_attention(_meta((1, 4, 8, 64)), _meta((1, 2, 8, 64)), _meta((1, 2, 8, 64)))


def test_sdpa_rejects_masks_that_change_something():
    q = torch.empty(1, 1, 4, 64, dtype=torch.float16)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    with pytest.raises(NotImplementedError, match="attn_mask: only masks that change nothing"):
        flash_attention.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        flash_attention.scaled_dot_product_attention(q, q, q, attn_mask=torch.full((4, 4), -1.0))
    with pytest.raises(ValueError, match="attn_mask: must be None when is_causal"):
        flash_attention.scaled_dot_product_attention(q, q, q, attn_mask=mask, is_causal=True)


def test_version_is_stated_once():
    from importlib import metadata

    try:
        installed = metadata.version("flash-attention-from-scratch")
    except metadata.PackageNotFoundError:
        pytest.skip("the package is not installed")
    assert installed == flash_attention.__version__


# ----------------------------------------------------------------------------------------------
# On the GPU


def _inputs(rng, batch=2, seqlen_q=300, seqlen_k=300, heads=(8, 2), d_head=128, dtype=torch.float16):
    q = helpers.random_tensor((batch, seqlen_q, heads[0], d_head), dtype, rng)
    k, v = (helpers.random_tensor((batch, seqlen_k, heads[1], d_head), dtype, rng) for _ in range(2))
    return q, k, v


CALLS = [
    dict(seqlen_q=300, seqlen_k=300),
    dict(seqlen_q=1024, seqlen_k=1024, causal=True),
    dict(seqlen_q=97, seqlen_k=400, causal=True, heads=(8, 1)),
    dict(seqlen_q=256, seqlen_k=256, window_size=(64, 0), dtype=torch.bfloat16, d_head=64),
    dict(seqlen_q=129, seqlen_k=65, softcap=20.0, d_head=96),
    dict(seqlen_q=200, seqlen_k=333, alibi=True, d_head=256, dtype=torch.bfloat16),
    dict(seqlen_q=1, seqlen_k=5000, causal=True, heads=(32, 8), batch=1, dtype=torch.bfloat16),
]


def _call_id(call):
    return "-".join(f"{k}{v}" for k, v in call.items()).replace("torch.", "").replace(" ", "")


@pytest.mark.gpu
@pytest.mark.parametrize("call", CALLS, ids=_call_id)
def test_flash_attn_func_matches_the_reference(call, rng):
    call = dict(call)
    shape = {key: call.pop(key) for key in ("seqlen_q", "seqlen_k", "heads", "d_head", "dtype", "batch") if key in call}
    q, k, v = _inputs(rng, **shape)
    if call.pop("alibi", False):
        call["alibi_slopes"] = torch.rand(q.shape[2], generator=rng, device="cuda") * 0.3
    if "softcap" in call:
        q = q * (call["softcap"] / 4)
    out, lse, probs = flash_attention.flash_attn_func(q, k, v, return_attn_probs=True, **call)
    assert probs is None
    reference = helpers.assert_matches_reference(out, q, k, v, **call)
    helpers.assert_lse_matches(lse, reference)
    assert torch.equal(flash_attention.flash_attn_func(q, k, v, **call), out), "repeated calls differ"
    choice = flash_attention.choose_config(q, k, **call)
    expected = flash_attention.forward(choice.config, q, k, v, helpers.nan_like(q), num_splits=choice.num_splits, **call)
    assert torch.equal(out, expected), f"flash_attn_func is not forward with the chosen configuration ({choice})"


@pytest.mark.gpu
def test_packed_entry_points_match_flash_attn_func(rng):
    qkv = helpers.random_tensor((2, 200, 3, 4, 64), torch.float16, rng)
    q, k, v = qkv.unbind(dim=2)
    expected = flash_attention.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(flash_attention.flash_attn_qkvpacked_func(qkv, causal=True), expected)
    assert torch.equal(flash_attention.flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True), expected)


SDPA_CALLS = [
    dict(seqlen_q=300, seqlen_k=300),
    dict(seqlen_q=300, seqlen_k=300, is_causal=True),
    dict(seqlen_q=100, seqlen_k=250, is_causal=True),  # top-left: the keys past the queries are never seen
    dict(seqlen_q=250, seqlen_k=100, is_causal=True),  # top-left: the last queries see every key
    dict(seqlen_q=128, seqlen_k=512, heads=(8, 2), enable_gqa=True, scale=0.3),
    dict(seqlen_q=64, seqlen_k=64, mask="all_true"),
    dict(seqlen_q=64, seqlen_k=64, mask="zeros"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("call", SDPA_CALLS, ids=_call_id)
def test_sdpa_matches_pytorch(call, rng):
    call = dict(call)
    seqlen_q, seqlen_k, heads = call.pop("seqlen_q"), call.pop("seqlen_k"), call.pop("heads", (4, 4))
    q, k, v = (t.transpose(1, 2) for t in _inputs(rng, 2, seqlen_q, seqlen_k, heads, 64, torch.bfloat16))
    mask = call.pop("mask", None)
    if mask == "all_true":
        call["attn_mask"] = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device="cuda")
    elif mask == "zeros":
        call["attn_mask"] = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bfloat16, device="cuda")
    out = flash_attention.scaled_dot_product_attention(q, k, v, **call)
    assert out.shape == q.shape
    # PyTorch's math backend in float32 is the reference; ours in bf16 must be within the
    # criterion's bound of it, judged against the same backend in bf16.
    ref32 = torch.nn.functional.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), **_float_mask(call))
    ref16 = torch.nn.functional.scaled_dot_product_attention(q, k, v, **call).float()
    error, bound = (out.float() - ref32).abs().max().item(), 2 * (ref16 - ref32).abs().max().item() + 1e-5
    assert error <= bound, f"max error {error:.3g} exceeds {bound:.3g}"


def _float_mask(call):
    call = dict(call)
    if "attn_mask" in call and call["attn_mask"].dtype != torch.bool:
        call["attn_mask"] = call["attn_mask"].float()
    return call


# ----------------------------------------------------------------------------------------------
# Plain eager calls skip the operators' dispatch (no GPU needed: a stand-in for the extension)


class _StandInExtension:
    """The extension with a forward that records its calls and returns an output without running
    anything, so the Python path runs on CPU tensors."""

    def __init__(self, extension):
        self._extension = extension
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._extension, name)

    def forward(self, cfg, q, k, v, o, *args):
        self.calls += 1
        return (torch.empty_like(q) if o is None else o), None, None


@pytest.fixture
def stand_in(monkeypatch):
    from flash_attention import ops

    extension = _StandInExtension(ops._C)
    monkeypatch.setattr(ops, "_C", extension)
    return extension


@pytest.fixture
def operator_calls(monkeypatch):
    """Counts the lookups-and-calls of the torch operators, which still run."""
    counts = {"forward": 0, "forward_out": 0}
    for name in counts:
        op = getattr(torch.ops.flash_attention, name)

        def counted(*args, _op=op, _name=name):
            counts[_name] += 1
            return _op(*args)

        monkeypatch.setattr(torch.ops.flash_attention, name, counted)
    return counts


def _cpu_inputs(requires_grad=False):
    cfg = flash_attention.compiled_configs()[0]
    q = torch.randn(1, 8, 2, cfg.d_head, dtype=torch.float16, requires_grad=requires_grad)
    return cfg, q, torch.randn_like(q), torch.randn_like(q)


def test_plain_eager_calls_skip_the_operators(stand_in, operator_calls):
    cfg, q, k, v = _cpu_inputs()
    out = flash_attention.forward(cfg, q, k, v, causal=True)
    o = torch.empty_like(q)
    version = o._version
    assert flash_attention.forward(cfg, q, k, v, o) is o
    assert o._version > version, "o is marked written, so autograd sees the change"
    assert out.shape == q.shape and stand_in.calls == 2
    assert operator_calls == {"forward": 0, "forward_out": 0}


@pytest.mark.gpu
def test_calls_under_a_mode_go_through_the_operators(rng, operator_calls):
    q, k, v = _inputs(rng)
    cfg = flash_attention.choose_config(q, k).config
    expected = flash_attention.forward(cfg, q, k, v)
    with torch.device("cuda"):  # a torch-function mode, as tracing and fake tensors bring their own modes
        assert torch.equal(flash_attention.forward(cfg, q, k, v), expected)
        o = torch.empty_like(q)
        version = o._version
        flash_attention.forward(cfg, q, k, v, o)
        assert torch.equal(o, expected) and o._version > version, "forward_out marks o written"
    # (The operators may look themselves up again on the way, so a call can count more than once.)
    assert operator_calls["forward"] >= 1 and operator_calls["forward_out"] >= 1


def test_missing_backward_raises_on_the_eager_path(stand_in):
    cfg, q, k, v = _cpu_inputs(requires_grad=True)
    for o in (None, torch.empty_like(q, requires_grad=False)):
        with pytest.raises(NotImplementedError, match="no backward pass"):
            flash_attention.forward(cfg, q, k, v, o)
    with torch.no_grad():
        assert not flash_attention.forward(cfg, q, k, v).requires_grad
    assert stand_in.calls == 1


def test_operators_check_their_arguments_in_the_extension():
    cfg, q, k, v = _cpu_inputs()
    args = (q, k, v, "", False, None, [-1, -1], 0.0, None, False)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        torch.ops.flash_attention.forward(*args)
    with pytest.raises(ValueError, match="window_size: left"):
        torch.ops.flash_attention.forward(q, k, v, "", False, None, [-2, 0], 0.0, None, False)
    with pytest.raises(TypeError, match="window_size: expected a pair"):
        torch.ops.flash_attention.forward(q, k, v, "", False, None, [1, 2, 3], 0.0, None, False)
    with pytest.raises(ValueError, match="cannot parse kernel name 'bogus'"):
        torch.ops.flash_attention.forward(q, k, v, "bogus", False, None, [-1, -1], 0.0, None, False)
    with pytest.raises(ValueError, match="softcap: must be >= 0"):
        torch.ops.flash_attention.forward_out(q, k, v, cfg.short_form(), False, None, [-1, -1], -1.0, None, False, q)


def test_operators_raise_where_a_backward_pass_would_be_needed():
    _, q, k, v = _cpu_inputs(requires_grad=True)
    args = (q, k, v, "", False, None, [-1, -1], 0.0, None, False)
    with pytest.raises(NotImplementedError, match="no backward pass"):
        torch.ops.flash_attention.forward(*args)
    with pytest.raises(NotImplementedError, match="no backward pass"):
        torch.ops.flash_attention.forward_out(*args, torch.empty_like(q, requires_grad=False))
    with torch.no_grad(), pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        torch.ops.flash_attention.forward(*args)  # past autograd, to the call's own checks


def test_heads_first_allocates_its_own_output():
    _, q, k, v = _cpu_inputs()
    with pytest.raises(ValueError, match="o: must be None with heads_first"):
        flash_attention._C.forward(None, q, k, v, torch.empty_like(q), False, False, None, (-1, -1), 0.0, None, False, True)


@pytest.mark.gpu
def test_missing_backward_raises_instead_of_detaching(rng):
    q, k, v = _inputs(rng)
    q.requires_grad_()
    with pytest.raises(NotImplementedError, match="no backward pass"):
        flash_attention.flash_attn_func(q, k, v)
    with pytest.raises(NotImplementedError, match="no backward pass"):
        flash_attention.forward(FP16_D128, q, k, v, torch.empty_like(q))
    with torch.no_grad():
        flash_attention.flash_attn_func(q, k, v)
    with torch.inference_mode():
        flash_attention.flash_attn_func(q, k, v)
    assert not flash_attention.flash_attn_func(q.detach(), k, v).requires_grad


def _op_args(rng, config="", return_lse=True, alibi=False):
    q, k, v = _inputs(rng, 2, 150, 170)
    slopes = torch.rand(8, generator=rng, device="cuda") * 0.3 if alibi else None
    return (q, k, v, config, True, None, [-1, 0], 0.0, slopes, return_lse)


@pytest.mark.gpu
@pytest.mark.parametrize("config", ["", FP16_D128])
@pytest.mark.parametrize("return_lse", [False, True])
def test_opcheck(rng, config, return_lse):
    if config and _parse(config) not in flash_attention.compiled_configs():
        pytest.skip(f"{config} is not compiled")
    torch.library.opcheck(torch.ops.flash_attention.forward.default, _op_args(rng, config, return_lse))
    args = _op_args(rng, config, return_lse, alibi=True)
    torch.library.opcheck(torch.ops.flash_attention.forward_out.default, (*args, torch.empty_like(args[0])))


@pytest.mark.gpu
@pytest.mark.parametrize(
    "name, fn",
    [
        ("flash_attn_func", lambda q, k, v: flash_attention.flash_attn_func(q, k, v, causal=True)),
        ("sdpa", lambda q, k, v: flash_attention.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)),
        ("forward", lambda q, k, v: flash_attention.forward(FP16_D128, q, k, v, window_size=(32, 8))),
        ("forward_cfg_object", lambda q, k, v: flash_attention.forward(_parse(FP16_D128), q, k, v)),
    ],
)  # fmt: skip
def test_torch_compile_fullgraph_without_breaks(name, fn, rng):
    torch._dynamo.reset()
    q, k, v = _inputs(rng)
    explanation = torch._dynamo.explain(fn)(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(fn, fullgraph=True)
    with torch.inference_mode():
        expected = fn(q, k, v)
        assert torch.equal(compiled(q, k, v), expected)
        q2, k2, v2 = _inputs(rng, seqlen_q=301, seqlen_k=333)
        assert torch.equal(compiled(q2, k2, v2), fn(q2, k2, v2)), "a recompiled shape differs"


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(rng):
    static = _inputs(rng, 2, 512, 512)
    flash_attention.flash_attn_func(*static, causal=True)  # choose and set up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flash_attention.flash_attn_func(*static, causal=True)
    for _ in range(2):
        fresh = _inputs(rng, 2, 512, 512)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, flash_attention.flash_attn_func(*fresh, causal=True))


@pytest.mark.gpu
def test_choice_on_this_gpu_is_compiled_and_explained(rng):
    q, k, _ = _inputs(rng)
    choice = flash_attention.choose_config(q, k, causal=True)
    assert choice.arch == dispatch.device_arch(q.device)
    assert choice.variant in flash_attention.compiled_variants(choice.config)
    assert choice.reason and str(choice).startswith(choice.config.short_form())
    table = dispatch.dispatch_table(choice.arch)
    if table is not None and not choice.reason.startswith("rule"):
        assert table.gpu in choice.reason


def test_python_m_flash_attention_describes_the_build():
    import os
    import pathlib
    import subprocess
    import sys

    # The package these tests import, wherever it is (installed, or built in place under py/).
    where = str(pathlib.Path(flash_attention.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "flash_attention"], capture_output=True, text=True, check=False, env=env
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"flash_attention {flash_attention.__version__} ")
    assert f"kernel set: {flash_attention.compiled_kernel_set()} ({len(flash_attention.compiled_configs())} " in (
        result.stdout
    )
    compiled_for = next(line for line in lines if line.startswith("compiled for: "))
    architectures = compiled_for.removeprefix("compiled for: ").split(", ")
    assert architectures and all(arch.startswith("sm_") and int(arch[3:]) >= 80 for arch in architectures)
    for cfg in flash_attention.compiled_configs():
        assert f"  {cfg.short_form()}" in lines
    tables = sorted(path.stem for path in dispatch.TABLES_DIR.glob("*.json"))
    assert f"dispatch tables shipped: {', '.join(tables) if tables else 'none'}" in lines
    if torch.cuda.is_available():
        assert f"dispatch table: {dispatch.device_arch()}" in result.stdout or "the rule chooses" in result.stdout
    else:
        assert "GPUs: none visible" in lines


def test_the_cache_check_names_cache_seqlens_and_cache_leftpad():
    """FLASH_ATTENTION_CHECK_SEQLENS's check of flash_attn_with_kvcache's lengths (CPU tensors: it
    only reads them)."""
    from flash_attention.sequence_checks import check_cache_contents

    lengths = torch.tensor([0, 90, 99], dtype=torch.int32)
    check_cache_contents(100, 1, lengths, None)
    check_cache_contents(100, 1, lengths, torch.tensor([0, 90, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^cache_seqlens: .* sequence 2 has 99"):
        check_cache_contents(100, 2, lengths, None)
    with pytest.raises(ValueError, match=r"^cache_seqlens: .* sequence 0 has -1"):
        check_cache_contents(100, 0, torch.tensor([-1], dtype=torch.int32), None)
    with pytest.raises(ValueError, match=r"^cache_leftpad: .* sequence 1 has 91 with cache_seqlens 90"):
        check_cache_contents(100, 1, lengths, torch.tensor([0, 91, 0], dtype=torch.int32))


def test_the_sequence_check_names_pages_and_cache_entries_past_the_cache():
    """FLASH_ATTENTION_CHECK_SEQLENS's check of block_table and kv_batch_idx (CPU tensors: it only
    reads them): a table entry that a sequence's used keys reach must be a page of k, and its
    lengths within its pages; a kv_batch_idx entry a batch entry of k."""
    from flash_attention.sequence_checks import check_sequence_contents

    q, pages = torch.empty(2, 1, 4, 64), torch.empty(5, 16, 2, 64)  # 5 pages of 16 rows
    table = torch.tensor([[0, 1, 7], [2, 3, 4]], dtype=torch.int32)  # 7 is past the pool
    int32 = lambda values: torch.tensor(values, dtype=torch.int32)  # noqa: E731
    check_sequence_contents(q, pages, {"block_table": table, "seqused_k": int32([32, 48])})
    with pytest.raises(ValueError, match=r"^block_table: entries must be in \[0, 5\) .* sequence 0 has 7 in column 2"):
        check_sequence_contents(q, pages, {"block_table": table, "seqused_k": int32([33, 48])})
    with pytest.raises(ValueError, match=r"^block_table: .* sequence 0 has 7"):
        check_sequence_contents(q, pages, {"block_table": table})  # every sequence uses all its pages
    packed = torch.empty(3, 4, 64)
    lengths = {"block_table": table, "cu_seqlens_q": int32([0, 1, 3]), "max_seqlen_q": 2, "max_seqlen_k": 48}
    check_sequence_contents(packed, pages, {**lengths, "cu_seqlens_k": int32([0, 20, 68])})
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: sequence 1 has 49 keys, more than its 3 pages of 16 rows hold"):
        check_sequence_contents(packed, pages, {**lengths, "cu_seqlens_k": int32([0, 20, 69])})
    with pytest.raises(ValueError, match=r"^cu_seqlens_k: must not decrease"):
        check_sequence_contents(packed, pages, {**lengths, "cu_seqlens_k": int32([0, 20, 10])})

    cache = torch.empty(3, 40, 2, 64)
    check_sequence_contents(q, cache, {"kv_batch_idx": int32([2, 0])})
    with pytest.raises(ValueError, match=r"^kv_batch_idx: entries must be in \[0, 3\) .* sequence 1 has 3"):
        check_sequence_contents(q, cache, {"kv_batch_idx": int32([2, 3])})
    with pytest.raises(ValueError, match=r"^seqused_k: .* sequence 0 uses 41 rows"):
        check_sequence_contents(q, cache, {"kv_batch_idx": int32([2, 0]), "seqused_k": int32([41, 0])})


def test_paged_and_indexed_shapes_are_checked_before_any_launch():
    """block_table's and kv_batch_idx's rules, checked from shapes alone (meta tensors), and appends
    with no page or no row to write to (CPU tensors: raised before the device is looked at)."""
    q, table = _meta((2, 1, 8, 128)), torch.empty((2, 4), dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match=r"^k: a paged cache is .* page_size a multiple of 16"):
        flash_attention.choose_config(q, _meta((6, 24, 2, 128)), block_table=table, arch="sm_90")
    with pytest.raises(TypeError, match=r"^block_table: dtype must be int32"):
        flash_attention.choose_config(q, _meta((6, 16, 2, 128)), block_table=table.long(), arch="sm_90")
    with pytest.raises(ValueError, match=r"^block_table: pages_per_sequence \* page_size exceeds"):
        flash_attention.choose_config(
            q, _meta((6, 1024, 2, 128)), block_table=torch.empty((2, 1 << 20), dtype=torch.int32, device="meta"),
            arch="sm_90",
        )
    with pytest.raises(ValueError, match=r"^k: kv_batch_idx picks entries of k's batch dimension, which has none"):
        flash_attention.choose_config(
            q, _meta((0, 16, 2, 128)), kv_batch_idx=torch.empty(2, dtype=torch.int32, device="meta"), arch="sm_90"
        )
    families = {
        c.family for c in flash_attention.compiled_configs()
        if c.dtype.name == "FP16" and c.d_head == 128 and any(v.varlen for v in flash_attention.compiled_variants(c))
    }
    if families == {"sm80", "sm90"} and 90 in [a // 10 for a in flash_attention._C.compiled_architectures()]:
        # A prefill against the cache: pages shorter than the Hopper family reads fast go to the
        # SM80 family's copies, longer ones to the Hopper family (both families read pages).
        prefill = _meta((2, 1024, 8, 128))
        for page_size, family in [(16, "sm80"), (256, "sm90")]:
            choice = flash_attention.choose_config(
                prefill, _meta((6, page_size, 2, 128)), block_table=table, causal=True, arch="sm_90"
            )
            assert choice.config.family == family, f"pages of {page_size} rows run on {choice.config}"
    hopper_160 = [
        c for c in flash_attention.compiled_configs()
        if c.family == "sm90" and c.dtype.name == "FP16" and c.d_head == 160
        and any(v.varlen for v in flash_attention.compiled_variants(c))
    ]
    if hopper_160 and not any(c.family == "sm80" and c.d_head == 160 for c in flash_attention.compiled_configs()):
        # No SM80 configuration serves d_head 160: short pages still run, on the Hopper family.
        choice = flash_attention.choose_config(
            _meta((2, 1024, 8, 160)), _meta((6, 16, 2, 160)), block_table=table, causal=True, arch="sm_90"
        )
        assert choice.config in hopper_160, f"pages of 16 rows at d_head 160 run on {choice.config}"
    half = dict(dtype=torch.float16)
    q, new = torch.empty(2, 1, 8, 128, **half), torch.empty(2, 1, 2, 128, **half)
    pages = torch.empty((0, 16, 2, 128), **half)
    with pytest.raises(ValueError, match=r"^k: a paged cache is \(num_pages, .* with at least one page"):
        flash_attention.flash_attn_with_kvcache(
            q, pages, pages, new, new, cache_seqlens=0, block_table=torch.zeros((2, 1), dtype=torch.int32)
        )
    rowless = torch.empty((2, 0, 2, 128), **half)
    with pytest.raises(ValueError, match=r"^k_cache: has no rows to append the new keys to"):
        flash_attention.flash_attn_with_kvcache(q, rowless, rowless, new, new, cache_seqlens=0)


def test_the_append_checks_its_tensors_before_any_launch():
    """flash_attn_with_kvcache's append (the operator append_to_cache) names the argument and the
    rule of a bad tensor from shapes and dtypes alone (CPU tensors: raised before the device is
    looked at), on the plain call and through the operator."""
    half = dict(dtype=torch.float16)
    q, cache, new = torch.empty(2, 1, 8, 64, **half), torch.empty(2, 32, 2, 64, **half), torch.empty(2, 1, 2, 64, **half)
    angles = torch.zeros(32, 16)
    cases = [
        (dict(k=new), ValueError, r"^k, v: give both new keys and new values, or neither"),
        (dict(rotary_cos=angles), ValueError, r"^rotary_cos, rotary_sin: give both, or neither"),
        (dict(k=new[:, :, :1], v=new[:, :, :1]), ValueError, r"^k, v: expected \(batch, seqlen_new, heads_kv, d\) = \(2, n, 2, 64\)"),
        (dict(k=new.float(), v=new.float()), ValueError, r"^k: Float on cpu, q is Half on cpu"),
        (dict(rotary_cos=torch.zeros(32, 40), rotary_sin=torch.zeros(32, 40)), ValueError, r"^rotary_cos: rotary_dim 80 is more than d_head 64"),
        (dict(rotary_cos=angles.int(), rotary_sin=angles.int()), ValueError, r"^rotary_cos, rotary_sin: expected contiguous float32 or Half"),
        (dict(rotary_cos=angles, rotary_sin=angles[:8]), ValueError, r"^rotary_cos, rotary_sin: expected two \(seqlen_ro, rotary_dim / 2\)"),
        # Every rule met: the device is the last one looked at.
        (dict(k=new, v=new, rotary_cos=angles, rotary_sin=angles), ValueError, r"^q: expected a CUDA tensor, got a tensor on cpu"),
    ]
    for keywords, error, message in cases:
        with pytest.raises(error, match=message):
            flash_attention.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=3, **keywords)
        arguments = {name: keywords.get(name) for name in ("k", "v", "rotary_cos", "rotary_sin")}
        with pytest.raises(error, match=message):
            torch.ops.flash_attention.append_to_cache(
                q, cache, cache, arguments["k"], arguments["v"], torch.full((2,), 3, dtype=torch.int32), None, None,
                arguments["rotary_cos"], arguments["rotary_sin"], True, True,
            )
    with pytest.raises(TypeError, match=r"^q: dtype must be float16 or bfloat16, got Float"):
        flash_attention.flash_attn_with_kvcache(q.float(), cache, cache, new, new, cache_seqlens=3)
