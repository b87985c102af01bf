"""What the GPU test modules (test_forward.py, test_features.py, test_varlen.py) and
tools/sanitize_cases.py share: whether the extension is built, the configurations under test,
problems (shapes and the forward call's keywords, dense or variable-length) with their random
inputs, the problem variant a problem needs, the checks against the float32 reference, and the
deterministic sampling of large test matrices.

Needs torch. flash_attention is imported only inside the functions that use it, so this module
imports before the extension is built.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import itertools
import math
import os
import pathlib
import random
import warnings
from collections.abc import Callable, Hashable, Sequence

import torch

from flash_helpers.dtypes import DType, output_dtype
from flash_helpers.problem import MaskKind, ProblemVariant, needed_variant
from flash_helpers.reference import reference_for_call

# Set to 1 to run the whole matrix of test_features.py instead of its default sample.
FULL_ENV = "FLASH_TEST_FULL"

NOT_BUILT_REASON = (
    "flash_attention._C is not built: run `bash tools/test.sh` or `pip install --no-build-isolation -e .`"
)


def full_matrix() -> bool:
    return os.environ.get(FULL_ENV, "0") not in ("", "0")


def extension_is_built() -> bool:
    """Whether a compiled flash_attention._C exists, found without importing the package (whose
    import needs it). A missing build skips the tests that need it; a build that fails to import
    fails them."""
    spec = importlib.util.find_spec("flash_attention")
    locations = (spec.submodule_search_locations or []) if spec else []
    return any(
        pathlib.Path(location, "_C" + suffix).exists()
        for location in locations
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )


def configs_under_test(decoding: bool = False, fp8: bool = False) -> list:
    """The compiled configurations that the visible GPU runs (a Hopper configuration runs on sm_90
    alone) and that have dense variants (with ``decoding``, the decoding configurations, compiled
    with their varlen variants alone, too), of 16-bit dtypes (with ``fp8``, the e4m3 ones too),
    restricted to those KERNELS selects when it is set. (The decoding configurations are tested
    through test_features' every-kernel test, the sanitizer's driver and test_decode; the e4m3 ones
    through test_fp8, the every-kernel test and the sanitizer's driver: the feature matrices are
    16-bit.)"""
    import flash_attention
    from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs

    compiled = [
        cfg for cfg in flash_attention.compiled_configs()
        if (decoding or not all(variant.varlen for variant in flash_attention.compiled_variants(cfg)))
        and (fp8 or cfg.dtype != DType.E4M3)
    ]  # fmt: skip
    if torch.cuda.is_available():
        capability = torch.cuda.get_device_capability()
        compiled = [cfg for cfg in compiled if cfg.runs_on(capability)]
    if not os.environ.get(KERNELS_ENV):
        return compiled
    selected = set(get_kernel_configs())
    missing = selected - set(compiled)
    if missing:
        warnings.warn(
            f"{len(missing)} configurations selected by {KERNELS_ENV}={os.environ[KERNELS_ENV]!r} are not compiled "
            f"into this build (kernel set {flash_attention.compiled_kernel_set()!r}) and are not tested; "
            "build them with FLASH_BUILD_KERNELS",
            stacklevel=1,
        )
    return [cfg for cfg in compiled if cfg in selected]


def compiled_arch_list() -> str:
    """The architectures the module was compiled for, as TORCH_CUDA_ARCH_LIST spells them ("8.0;9.0")."""
    from flash_attention import _C

    return ";".join(f"{number // 100}.{number // 10 % 10}" for number in _C.compiled_architectures())


def holds_the_default_set() -> bool:
    """Whether this build compiled every configuration of the default set (for the architectures it
    was built for), so that the automatic choice has a configuration for every call it serves."""
    import flash_attention
    from flash_helpers.kernel_sets import get_kernels_to_build

    return set(get_kernels_to_build("default", compiled_arch_list())) <= set(flash_attention.compiled_configs())


def call_or_skip_in_a_subset_build(call: Callable):
    """call(), a call the automatic choice serves; skipped, with its error, where the choice has no
    compiled configuration for it because the build holds part of the default set alone (a
    FLASH_BUILD_KERNELS selection). In a build of the default set that error fails the test."""
    import pytest

    try:
        return call()
    except ValueError as error:
        if "no configuration compiled into this build" in str(error) and not holds_the_default_set():
            pytest.skip(f"a subset build: {error}")
        raise


def configs_with(configs: Sequence, *variants: ProblemVariant) -> list:
    """Those of ``configs`` compiled for every one of ``variants``."""
    import flash_attention

    return [cfg for cfg in configs if set(variants) <= set(flash_attention.compiled_variants(cfg))]


# ----------------------------------------------------------------------------------------------
# Problems and inputs


def random_tensor(shape, dtype: torch.dtype, rng: torch.Generator) -> torch.Tensor:
    if dtype.itemsize == 1:
        # torch draws no 8-bit floats: drawn in float32, then rounded.
        return torch.randn(shape, generator=rng, device=rng.device).to(dtype)
    return torch.randn(shape, generator=rng, device=rng.device, dtype=dtype)


def random_qkv(cfg, batch: int, heads: int, seq_len: int, rng: torch.Generator) -> list[torch.Tensor]:
    """q, k and v of one (batch, seq_len, heads, d_head) shape."""
    shape = (batch, seq_len, heads, cfg.d_head)
    return [random_tensor(shape, cfg.dtype.to_torch_dtype(), rng) for _ in range(3)]


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer poisoned with NaN, so any element the kernel fails to write shows."""
    return torch.full_like(t, float("nan"))


ALIBI_SHAPES = (None, "per_head", "per_batch_head")


@dataclasses.dataclass(frozen=True)
class VarlenLayout:
    """How a variable-length batch reaches the kernel. ``packed``: the sequences one after another
    in (total, heads, d_head) tensors, told apart by cu_seqlens_q and cu_seqlens_k (FlashAttention-2's
    varlen); otherwise each sequence in its batch entry of (batch, seqlen, heads, d_head) tensors.
    ``seqused_*`` and ``leftpad_*``: on that side (q, or k and v) each sequence's slot holds more rows
    than it uses, the sequence starting leftpad rows in (left padding) and using seqused rows (right
    padding, FlashAttention-3's seqused); without either, a 4-D side's sequences fill their slots."""

    packed: bool = True
    seqused_q: bool = False
    seqused_k: bool = False
    leftpad_q: bool = False
    leftpad_k: bool = False

    def padded(self, side: str) -> bool:
        """Whether the slots of ``side`` ("q" or "k") hold rows the sequences do not use."""
        return getattr(self, f"seqused_{side}") or getattr(self, f"leftpad_{side}")

    def describe(self) -> str:
        """``packed``, ``padded+seqused_k+leftpad_k``, ..."""
        flags = [name for name in ("seqused_q", "seqused_k", "leftpad_q", "leftpad_k") if getattr(self, name)]
        return "+".join(["packed" if self.packed else "padded", *flags])


# The layouts the variable-length tests sweep: packed alone (FlashAttention-2's varlen), packed slots
# with seqused and leftpad, and 4-D slots padded on the right (seqused), on the left (leftpad) or both.
VARLEN_LAYOUTS = {
    "packed": VarlenLayout(),
    "packed_seqused": VarlenLayout(seqused_q=True, seqused_k=True),
    "packed_leftpad_seqused": VarlenLayout(True, True, True, True, True),
    "padded_right": VarlenLayout(packed=False, seqused_q=True, seqused_k=True),
    "padded_left": VarlenLayout(packed=False, leftpad_q=True, leftpad_k=True),
    "padded_both_sides": VarlenLayout(False, True, True, True, True),
}
# Unused rows each padded slot may hold: up to this many past the sequence in packed slots, and this
# many past the longest sequence in 4-D slots.
SLOT_PADDING = 9


@dataclasses.dataclass(frozen=True)
class Varlen:
    """A variable-length batch: each sequence's used query and key lengths, and how the call lays
    them out."""

    lengths_q: tuple[int, ...]
    lengths_k: tuple[int, ...]
    layout: VarlenLayout = VarlenLayout()

    def __post_init__(self):
        if len(self.lengths_q) != len(self.lengths_k) or not self.lengths_q:
            raise ValueError(f"one query and one key length per sequence: {self.lengths_q}, {self.lengths_k}")
        for side, lengths in (("q", self.lengths_q), ("k", self.lengths_k)):
            if not self.layout.packed and not self.layout.padded(side) and len(set(lengths)) > 1:
                raise ValueError(f"4-D {side} without seqused or leftpad: every sequence fills its slot, {lengths}")

    def seqlen(self, side: str) -> int:
        """The length the call's mask kind is decided at: max_seqlen (packed), or the slots' length
        (4-D, where padded slots hold SLOT_PADDING rows past the longest sequence)."""
        longest = max(self.lengths_q if side == "q" else self.lengths_k)
        return longest + SLOT_PADDING if not self.layout.packed and self.layout.padded(side) else longest

    def describe(self) -> str:
        """``packed-q0.1.97-k5.1.203``: the layout and the lengths."""
        lengths = (".".join(map(str, self.lengths_q)), ".".join(map(str, self.lengths_k)))
        return f"{self.layout.describe()}-q{lengths[0]}-k{lengths[1]}"

    def side(self, side: str, rng: torch.Generator) -> tuple[list[int], dict]:
        """The length of each slot of ``side`` ("q", or "k" for k and v) and the call's keywords for
        that side; how many unused rows a packed slot holds, and how many of them come first where
        both leftpad and seqused are given, are drawn from ``rng``."""
        lengths = self.lengths_q if side == "q" else self.lengths_k
        seqused, leftpad = getattr(self.layout, f"seqused_{side}"), getattr(self.layout, f"leftpad_{side}")
        if self.layout.packed:
            padding = _random_ints(len(lengths), SLOT_PADDING, rng) if self.layout.padded(side) else [0] * len(lengths)
        else:
            padding = [self.seqlen(side) - length for length in lengths]
        # Left padding takes every unused row where seqused is not given, a random share where it is.
        if not leftpad:
            left = [0] * len(lengths)
        elif not seqused:
            left = padding
        else:
            left = [share % (pad + 1) for share, pad in zip(_random_ints(len(lengths), SLOT_PADDING, rng), padding)]
        slots = [length + pad for length, pad in zip(lengths, padding)]
        keywords = {}
        if self.layout.packed:
            keywords[f"cu_seqlens_{side}"] = _int32([0, *itertools.accumulate(slots)], rng.device)
            keywords[f"max_seqlen_{side}"] = max(lengths)
        if seqused:
            keywords[f"seqused_{side}"] = _int32(lengths, rng.device)
        if leftpad:
            keywords[f"leftpad_{side}"] = _int32(left, rng.device)
        return slots, keywords


def _random_ints(count: int, highest: int, rng: torch.Generator) -> list[int]:
    """``count`` integers drawn uniformly from 0 to ``highest``."""
    return torch.randint(highest + 1, (count,), generator=rng, device=rng.device).tolist()


def _int32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


@dataclasses.dataclass(frozen=True)
class Problem:
    """A forward call without its configuration: the shapes and the keywords."""

    seqlen_q: int
    seqlen_k: int
    heads_q: int = 4
    heads_kv: int = 2
    batch: int = 2
    causal: bool = False
    window_size: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: str | None = None  # one of ALIBI_SHAPES: the slopes' shape, (heads_q,) or (batch, heads_q)
    softmax_scale: float | None = None
    # A variable-length batch: seqlen_q and seqlen_k are then the lengths its mask kind is decided at
    # (Varlen.seqlen) and batch its number of sequences; varlen_problem fills them in.
    varlen: Varlen | None = None
    # k and v an FP8 cache: float8_e4m3fn beside 16-bit q, with per-(batch, kv head) descales.
    kv_e4m3: bool = False

    def __post_init__(self):
        if self.varlen is not None:
            shape = (self.varlen.seqlen("q"), self.varlen.seqlen("k"), len(self.varlen.lengths_q))
            if (self.seqlen_q, self.seqlen_k, self.batch) != shape:
                raise ValueError(
                    f"(seqlen_q, seqlen_k, batch) of a variable-length batch are {shape}: use varlen_problem"
                )

    def describe(self) -> str:
        """A test id: ``q113_k203-h4_2-b2`` (for a variable-length batch its Varlen.describe()) and the
        keywords that are not the defaults."""
        shape = self.varlen.describe() if self.varlen else f"q{self.seqlen_q}_k{self.seqlen_k}"
        parts = [shape, f"h{self.heads_q}_{self.heads_kv}", f"b{self.batch}"]
        if self.causal:
            parts.append("causal")
        if self.window_size != (-1, -1):
            parts.append(f"window{self.window_size[0]}_{self.window_size[1]}")
        if self.softcap:
            parts.append(f"softcap{self.softcap:g}")
        if self.alibi:
            parts.append(f"alibi_{self.alibi}")
        if self.softmax_scale is not None:
            parts.append(f"scale{self.softmax_scale:g}")
        if self.kv_e4m3:
            parts.append("kv_e4m3")
        return "-".join(parts)

    def variant(self, cfg) -> ProblemVariant:
        """The problem variant the binding looks up for this call."""
        score_mods = self.softcap > 0 or self.alibi is not None
        return needed_variant(
            cfg, self.seqlen_q, self.seqlen_k, self.causal, self.window_size, score_mods, varlen=self.varlen is not None,
            kv_e4m3=self.kv_e4m3,
        )  # fmt: skip

    def make(self, cfg, rng: torch.Generator) -> Inputs:
        """Fresh random inputs for ``cfg``'s dtype and d_head: (batch, seqlen, heads, d_head) tensors,
        or for a variable-length batch its layout's tensors and keywords, the rows no sequence uses
        holding NaN (a kernel that lets them into a result shows, even times a zero probability).
        An FP8 cache's k and v are those values rounded to e4m3, with descales that differ per
        (sequence, kv head)."""
        dtype = cfg.dtype.to_torch_dtype()
        # 8-bit values are drawn in float32 (NaN written and softcap's factor applied there: torch
        # does neither on 8-bit floats), then rounded.
        drawn = torch.float32 if dtype.itemsize == 1 else dtype
        kv_drawn = torch.float32 if self.kv_e4m3 else drawn
        kwargs = {}
        if self.varlen is None:
            q_rows, k_rows = (self.batch, self.seqlen_q), (self.batch, self.seqlen_k)
        else:
            slots_q, keywords_q = self.varlen.side("q", rng)
            slots_k, keywords_k = self.varlen.side("k", rng)
            kwargs.update(keywords_q, **keywords_k)
            packed = self.varlen.layout.packed
            q_rows = (sum(slots_q),) if packed else (self.batch, self.seqlen_q)
            k_rows = (sum(slots_k),) if packed else (self.batch, self.seqlen_k)
        q = random_tensor((*q_rows, self.heads_q, cfg.d_head), drawn, rng)
        k, v = (random_tensor((*k_rows, self.heads_kv, cfg.d_head), kv_drawn, rng) for _ in range(2))
        if self.varlen is not None:
            poison_unused_rows(q, slots_q, self.varlen.lengths_q, kwargs.get("leftpad_q"))
            for t in (k, v):
                poison_unused_rows(t, slots_k, self.varlen.lengths_k, kwargs.get("leftpad_k"))
        if self.kv_e4m3:
            # (NaN stays NaN in e4m3.) The descales scale the stored values whatever they are.
            k, v = k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn)
            for name in ("k_descale", "v_descale"):
                kwargs[name] = torch.rand((self.batch, self.heads_kv), generator=rng, device=rng.device) * 1.5 + 0.5
        if self.softcap > 0:
            # As FlashAttention's tests do: scores reach several times softcap, where the cap bends.
            q = (q.float() * (self.softcap / 4)).to(drawn)
        if dtype.itemsize == 1:
            q, k, v = (t.to(dtype) for t in (q, k, v))
        if self.causal:
            kwargs["causal"] = True
        if self.window_size != (-1, -1):
            kwargs["window_size"] = self.window_size
        if self.softcap:
            kwargs["softcap"] = self.softcap
        if self.softmax_scale is not None:
            kwargs["softmax_scale"] = self.softmax_scale
        if self.alibi is not None:
            shape = (self.heads_q,) if self.alibi == "per_head" else (self.batch, self.heads_q)
            # FlashAttention's tests' slopes: uniform in [0, 0.3).
            kwargs["alibi_slopes"] = torch.rand(shape, generator=rng, device=rng.device) * 0.3
        return Inputs(q, k, v, kwargs)


def poison_unused_rows(t: torch.Tensor, slots: list[int], lengths: Sequence[int], leftpad: torch.Tensor | None) -> None:
    """NaN in the rows of ``t`` (packed (total, ...) or 4-D (batch, slot, ...)) that no sequence
    uses: sequence b uses ``lengths[b]`` rows of its slot of ``slots[b]`` rows, from leftpad[b] on."""
    rows = t.view(-1, *t.shape[-2:])
    unused = torch.ones(rows.shape[0], dtype=torch.bool)
    left = leftpad.tolist() if leftpad is not None else [0] * len(lengths)
    for start, skipped, length in zip(itertools.accumulate([0, *slots[:-1]]), left, lengths):
        unused[start + skipped : start + skipped + length] = False
    rows[unused.to(t.device)] = float("nan")


def varlen_problem(varlen: Varlen, **keywords) -> Problem:
    """The Problem of a variable-length batch; ``keywords`` are Problem's fields other than the
    shape (heads_q, heads_kv, causal, window_size, softcap, alibi, softmax_scale)."""
    return Problem(varlen.seqlen("q"), varlen.seqlen("k"), batch=len(varlen.lengths_q), varlen=varlen, **keywords)


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict  # flash_attention.forward's keywords (the variable-length ones too), return_lse aside

    def forward(self, cfg, o=None, **extra):
        import flash_attention

        return flash_attention.forward(cfg, self.q, self.k, self.v, o, **self.kwargs, **extra)

    def reference(self):
        """The FloatReference, for FP8 inputs the Fp8Reference, or for a variable-length call the
        VarlenReference."""
        return reference_for_call(self.q, self.k, self.v, **self.kwargs)

    def poisoned_output(self) -> torch.Tensor:
        """An o for this call poisoned with NaN: q's shape, the output's dtype (q's, or for FP8
        inputs out_dtype's)."""
        out_dtype = self.kwargs.get("out_dtype")
        asked = None if out_dtype is None else DType.from_torch_dtype(out_dtype)
        dtype = output_dtype(DType.from_torch_dtype(self.q.dtype), asked).to_torch_dtype()
        return torch.full(self.q.shape, float("nan"), dtype=dtype, device=self.q.device)


@dataclasses.dataclass
class PagedCache:
    """Sequences' keys and values on pages of page_size rows (a paged KV cache): the pages of all
    sequences in random order in one pool with spare pages, and the table's columns past a
    sequence's last page holding entries past the pool, which nothing may read."""

    k: torch.Tensor  # (num_pages, page_size, heads_kv, d_head)
    v: torch.Tensor
    block_table: torch.Tensor  # (batch, pages_per_sequence) int32
    lengths: list[int]

    @classmethod
    def of(cls, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], page_size: int, rng, spare_pages: int = 3):
        """The cache of sequence b's keys[b] and values[b], each (n_b, heads_kv, d_head)."""
        lengths = [len(k) for k in keys]
        pages_of = [-(-n // page_size) for n in lengths]
        per_sequence = max(1, *pages_of)
        num_pages = sum(pages_of) + spare_pages
        order = torch.randperm(num_pages, generator=rng, device=rng.device).tolist()
        table = torch.full((len(keys), per_sequence), 1 << 30, dtype=torch.int32)
        device = keys[0].device
        pools = [random_tensor((num_pages, page_size, *keys[0].shape[1:]), keys[0].dtype, rng).to(device) for _ in range(2)]
        for b, count in enumerate(pages_of):
            table[b, :count] = torch.tensor(order[:count], dtype=torch.int32)
            order = order[count:]
            for pool, rows in zip(pools, (keys[b], values[b])):
                for j, page in enumerate(table[b, :count].tolist()):
                    chunk = rows[j * page_size : (j + 1) * page_size]
                    pool[page, : len(chunk)] = chunk
        return cls(pools[0], pools[1], table.to(device), lengths)

    @property
    def page_size(self) -> int:
        return self.k.shape[1]

    def poison_unused_rows(self) -> None:
        """NaN in the pools' rows that hold no sequence's key (past each sequence's last key in its
        last page, and the spare pages): a kernel that lets them into a result shows."""
        used = torch.zeros(self.k.shape[:2], dtype=torch.bool)
        for b, count in enumerate(self.lengths):
            for j, page in enumerate(self.block_table[b, : -(-count // self.page_size)].tolist()):
                used[page, : min(self.page_size, count - j * self.page_size)] = True
        for pool in (self.k, self.v):
            pool[~used.to(pool.device)] = float("nan")

    def rows(self, pool: torch.Tensor, b: int, count: int) -> torch.Tensor:
        """The first ``count`` rows of sequence b that ``pool`` (self.k or self.v) holds."""
        pages = self.block_table[b, : -(-count // self.page_size)].long()
        return pool[pages].flatten(0, 1)[:count]


def variant_id(variant: ProblemVariant) -> str:
    """A test id: ``causal-masked_tails-score_mods``, ``none``, ``local-masked_tails-score_mods-varlen-kv_e4m3``, ..."""
    flags = [
        name
        for name, on in (
            ("masked_tails", variant.masked_tails),
            ("score_mods", variant.score_mods),
            ("varlen", variant.varlen),
            ("kv_e4m3", variant.kv_e4m3),
        )
        if on
    ]
    return "-".join([variant.mask.name.lower(), *flags])


def whole_blocks(cfg) -> int:
    """The shortest length that is a whole number of both query blocks and key tiles."""
    return math.lcm(cfg.B_r, cfg.B_c)


def problem_for_variant(cfg, variant: ProblemVariant, batch: int = 2, heads: tuple[int, int] = (4, 2)) -> Problem:
    """A small problem that needs exactly ``variant`` of ``cfg``: ragged lengths (a partial last
    query block and key tile) for masked tails, whole blocks otherwise; seqlen_q > seqlen_k under a
    mask, so whole query blocks and parts of blocks attend no key; a window bounded on both sides
    for local; softcap and per-(batch, head) ALiBi slopes for score mods; grouped heads
    ((heads_q, heads_kv) = ``heads``).

    A varlen variant gets a packed batch of its own five sequences (``batch`` does not apply): no
    queries; one query and one key; more queries than keys, and fewer, both with partial last
    blocks; queries without any key. The last sequence ends the tensors, so a read past a
    sequence's end leaves them."""
    block = whole_blocks(cfg)
    if variant.masked_tails:
        long, short = 2 * block + 45, block + 19
    else:
        long, short = 3 * block, 2 * block
    seqlen_q, seqlen_k = (long, short) if variant.mask != MaskKind.NONE else (short, long)
    keywords = dict(
        heads_q=heads[0],
        heads_kv=heads[1],
        causal=variant.mask == MaskKind.CAUSAL,
        window_size=(block // 2 + 3, 7) if variant.mask == MaskKind.LOCAL else (-1, -1),
        softcap=30.0 if variant.score_mods else 0.0,
        alibi="per_batch_head" if variant.score_mods else None,
        kv_e4m3=variant.kv_e4m3,
    )
    if variant.varlen:
        lengths = Varlen((0, 1, long, short, block // 2 + 3), (short, 1, short, long, 0))
        problem = varlen_problem(lengths, **keywords)
    else:
        problem = Problem(seqlen_q, seqlen_k, batch=batch, **keywords)
    assert problem.variant(cfg) == variant, f"{problem.describe()} needs {problem.variant(cfg)}, not {variant}"
    return problem


# ----------------------------------------------------------------------------------------------
# Checks


def assert_matches_reference(out, q, k, v, **kwargs):
    """``out`` of a forward call with these tensors and keywords (variable-length ones too) meets the
    criterion; returns the reference."""
    reference = reference_for_call(q, k, v, **kwargs)
    comparison = reference.compare(out)
    assert comparison.passed, f"output differs from the float32 reference: {comparison.describe()}"
    return reference


def assert_lse_matches(lse, reference) -> None:
    comparison = reference.compare_lse(lse)
    assert comparison.passed, f"lse differs from the float32 reference: {comparison.describe()}"


def assert_rows_without_keys_are_zero(out, reference) -> None:
    """Rows that attend no key (and, with seqused or leftpad, rows outside every sequence) must be
    exactly 0: the criterion alone would allow small values."""
    assert (reference.outputs_without_keys(out) == 0).all(), "a row that attends no key (or no sequence uses) is not 0"


def check_forward(cfg, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``cfg`` on ``inputs`` three times (into a NaN-poisoned o, the same with return_lse, and
    into an o it allocates) and checks each the tests require: o written in full and returned,
    output and lse against the reference, exact zeros and +inf on the rows without keys, and
    bitwise-identical repeated calls. Returns (o, lse)."""
    given = inputs.poisoned_output()
    out = inputs.forward(cfg, given)
    assert out.data_ptr() == given.data_ptr(), "forward must return the o it was given"
    assert not out.isnan().any(), "some output elements were not written"
    out_with_lse, lse = inputs.forward(cfg, inputs.poisoned_output(), return_lse=True)
    allocated, lse_again = inputs.forward(cfg, return_lse=True)

    reference = inputs.reference()
    comparison = reference.compare(out)
    assert comparison.passed, f"output differs from the float32 reference: {comparison.describe()}"
    assert_rows_without_keys_are_zero(out, reference)
    assert (tuple(lse.shape), lse.dtype, lse.device) == (reference.lse_shape, torch.float32, inputs.q.device)
    assert_lse_matches(lse, reference)
    assert torch.equal(out, out_with_lse), "returning lse changed the output"
    assert torch.equal(out, allocated), "repeated calls differ"
    assert torch.equal(lse, lse_again), "repeated calls give different lse"
    return out, lse


def as_layout(tensors: Sequence[torch.Tensor], layout: str) -> list[torch.Tensor]:
    """Copies of (batch, seq, heads, d_head) tensors stored in another layout, seen through views of
    the same shapes whose strides differ from the contiguous ones."""
    if layout == "packed":
        # One (batch, seq, sum of the heads, d_head) tensor, as a fused QKV projection produces
        # (the tensors must share batch and seq).
        packed = torch.cat(list(tensors), dim=2)
        return list(packed.split([t.shape[2] for t in tensors], dim=2))
    if layout == "heads_major":
        # (batch, heads, seq, d_head) storage.
        return [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors]
    raise ValueError(f"unknown layout {layout!r}")


# ----------------------------------------------------------------------------------------------
# Parametrizing and sampling large matrices


# The score modifications the feature tests sweep, name: (softcap, alibi slopes' shape).
SCORE_MODS = {
    "plain": (0.0, None),
    "softcap": (30.0, None),
    "alibi_per_head": (0.0, "per_head"),
    "alibi_per_batch_head": (0.0, "per_batch_head"),
    "softcap_alibi": (30.0, "per_batch_head"),
}


def gpu_cases(argnames: str, cases: Sequence[tuple], describe: Callable[..., str], empty_reason: str):
    """pytest.mark.parametrize over ``cases`` (tuples of argument values, ``describe(*case)`` their
    ids); one skipped case, with the reason, where the extension is not built or no case suits the
    build (``empty_reason``)."""
    import pytest

    reason = None if extension_is_built() else NOT_BUILT_REASON
    if reason is None and not cases:
        reason = empty_reason
    if reason is not None:
        placeholder = [None] * len(argnames.split(","))
        return pytest.mark.parametrize(argnames, [pytest.param(*placeholder, marks=pytest.mark.skip(reason=reason))])
    return pytest.mark.parametrize(argnames, [pytest.param(*case, id=describe(*case)) for case in cases])


def covering_sample(
    cases: Sequence,
    axes: Callable[[object], tuple[Hashable, ...]],
    seed: str,
    extra_groups: Sequence[tuple[int, ...]] = (),
) -> list:
    """Every case under FLASH_TEST_FULL; otherwise a deterministic subset in which every pair of
    values of any two axes (``axes(case)`` gives a case's values) appears at least once, and so does
    every combination of the axes in each of ``extra_groups``: the cases, in an order shuffled by
    ``seed``, each kept if it covers a combination not covered yet. Returned in the given order."""
    if full_matrix():
        return list(cases)
    values = [axes(case) for case in cases]
    n_axes = len(values[0]) if values else 0
    groups = [*itertools.combinations(range(n_axes), 2), *extra_groups]
    order = list(range(len(cases)))
    random.Random(seed).shuffle(order)
    covered: set = set()
    chosen = []
    for index in order:
        combinations = {(group, tuple(values[index][axis] for axis in group)) for group in groups}
        if not combinations <= covered:
            covered |= combinations
            chosen.append(index)
    return [cases[index] for index in sorted(chosen)]
