"""What the GPU test modules (test_forward.py, test_features.py) and tools/sanitize_cases.py share:
whether the extension is built, the configurations under test, problems (shapes and the forward
call's keywords) with their random inputs, the problem variant a problem needs, the checks against
the float32 reference, and the deterministic sampling of large test matrices.

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

from flash_helpers.problem import MaskKind, ProblemVariant, needed_variant
from flash_helpers.reference import FloatReference

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


def configs_under_test() -> list:
    """The compiled configurations that the visible GPU runs (a Hopper configuration runs on sm_90
    alone), restricted to those KERNELS selects when it is set."""
    import flash_attention
    from flash_helpers.kernel_sets import KERNELS_ENV, get_kernel_configs

    compiled = flash_attention.compiled_configs()
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


def configs_with(configs: Sequence, *variants: ProblemVariant) -> list:
    """Those of ``configs`` compiled for every one of ``variants``."""
    import flash_attention

    return [cfg for cfg in configs if set(variants) <= set(flash_attention.compiled_variants(cfg))]


# ----------------------------------------------------------------------------------------------
# Problems and inputs


def random_tensor(shape, dtype: torch.dtype, rng: torch.Generator) -> torch.Tensor:
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

    def describe(self) -> str:
        """A test id: ``q113_k203-h4_2-b2`` and the keywords that are not the defaults."""
        parts = [f"q{self.seqlen_q}_k{self.seqlen_k}", f"h{self.heads_q}_{self.heads_kv}", f"b{self.batch}"]
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
        return "-".join(parts)

    def variant(self, cfg) -> ProblemVariant:
        """The problem variant the binding looks up for this call."""
        score_mods = self.softcap > 0 or self.alibi is not None
        return needed_variant(cfg, self.seqlen_q, self.seqlen_k, self.causal, self.window_size, score_mods)

    def make(self, cfg, rng: torch.Generator) -> Inputs:
        """Fresh random inputs for ``cfg``'s dtype and d_head."""
        dtype = cfg.dtype.to_torch_dtype()
        q = random_tensor((self.batch, self.seqlen_q, self.heads_q, cfg.d_head), dtype, rng)
        k, v = (random_tensor((self.batch, self.seqlen_k, self.heads_kv, cfg.d_head), dtype, rng) for _ in range(2))
        if self.softcap > 0:
            # As FlashAttention's tests do: scores reach several times softcap, where the cap bends.
            q = q * (self.softcap / 4)
        kwargs = {}
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


@dataclasses.dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kwargs: dict  # flash_attention.forward's keywords, return_lse aside

    def forward(self, cfg, o=None, **extra):
        import flash_attention

        return flash_attention.forward(cfg, self.q, self.k, self.v, o, **self.kwargs, **extra)

    def reference(self) -> FloatReference:
        return FloatReference(self.q, self.k, self.v, **self.kwargs)


def variant_id(variant: ProblemVariant) -> str:
    """A test id: ``causal-masked_tails-score_mods``, ``none``, ..."""
    flags = [name for name, on in (("masked_tails", variant.masked_tails), ("score_mods", variant.score_mods)) if on]
    return "-".join([variant.mask.name.lower(), *flags])


def whole_blocks(cfg) -> int:
    """The shortest length that is a whole number of both query blocks and key tiles."""
    return math.lcm(cfg.B_r, cfg.B_c)


def problem_for_variant(cfg, variant: ProblemVariant, batch: int = 2, heads: tuple[int, int] = (4, 2)) -> Problem:
    """A small problem that needs exactly ``variant`` of ``cfg``: ragged lengths (a partial last
    query block and key tile) for masked tails, whole blocks otherwise; seqlen_q > seqlen_k under a
    mask, so whole query blocks and parts of blocks attend no key; a window bounded on both sides
    for local; softcap and per-(batch, head) ALiBi slopes for score mods; grouped heads
    ((heads_q, heads_kv) = ``heads``)."""
    block = whole_blocks(cfg)
    if variant.masked_tails:
        long, short = 2 * block + 45, block + 19
    else:
        long, short = 3 * block, 2 * block
    seqlen_q, seqlen_k = (long, short) if variant.mask != MaskKind.NONE else (short, long)
    problem = Problem(
        seqlen_q,
        seqlen_k,
        heads_q=heads[0],
        heads_kv=heads[1],
        batch=batch,
        causal=variant.mask == MaskKind.CAUSAL,
        window_size=(block // 2 + 3, 7) if variant.mask == MaskKind.LOCAL else (-1, -1),
        softcap=30.0 if variant.score_mods else 0.0,
        alibi="per_batch_head" if variant.score_mods else None,
    )
    assert problem.variant(cfg) == variant, f"{problem.describe()} needs {problem.variant(cfg)}, not {variant}"
    return problem


# ----------------------------------------------------------------------------------------------
# Checks


def assert_matches_reference(out, q, k, v, **kwargs) -> FloatReference:
    reference = FloatReference(q, k, v, **kwargs)
    comparison = reference.compare(out)
    assert comparison.passed, f"output differs from the float32 reference: {comparison.describe()}"
    return reference


def assert_lse_matches(lse, reference: FloatReference) -> None:
    comparison = reference.compare_lse(lse)
    assert comparison.passed, f"lse differs from the float32 reference: {comparison.describe()}"


def assert_rows_without_keys_are_zero(out, reference: FloatReference) -> None:
    """Rows that attend no key must be exactly 0 (the criterion alone would allow small values)."""
    rows = reference.rows_without_keys
    assert (out[:, rows] == 0).all(), "a query row that attends no key is not 0"


def check_forward(cfg, inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """Runs ``cfg`` on ``inputs`` three times (into a NaN-poisoned o, the same with return_lse, and
    into an o it allocates) and checks each the tests require: o written in full and returned,
    output and lse against the reference, exact zeros and +inf on the rows without keys, and
    bitwise-identical repeated calls. Returns (o, lse)."""
    given = nan_like(inputs.q)
    out = inputs.forward(cfg, given)
    assert out.data_ptr() == given.data_ptr(), "forward must return the o it was given"
    assert not out.isnan().any(), "some output elements were not written"
    out_with_lse, lse = inputs.forward(cfg, nan_like(inputs.q), return_lse=True)
    allocated, lse_again = inputs.forward(cfg, return_lse=True)

    reference = inputs.reference()
    comparison = reference.compare(out)
    assert comparison.passed, f"output differs from the float32 reference: {comparison.describe()}"
    assert_rows_without_keys_are_zero(out, reference)
    assert (lse.shape, lse.dtype, lse.device) == (reference.lse.shape, torch.float32, inputs.q.device)
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
# Sampling large matrices


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
