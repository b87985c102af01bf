"""The problem side of a kernel: problem variants (the compile-time specializations a problem needs
and a tuning choice does not) and the FLOP counts every TFLOP/s figure uses.

Importable without torch.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = [
    "ALL_VARIANTS",
    "BENCHMARK_LENGTH_UNIT",
    "BENCHMARK_TAIL_VARIANTS",
    "BENCHMARK_VARIANTS",
    "KV_E4M3_VARIANTS",
    "MaskKind",
    "ProblemVariant",
    "VARLEN_VARIANTS",
    "attention_flop",
    "mask_kind",
    "needed_variant",
    "total_flop",
]


class MaskKind(enum.IntEnum):
    """Which keys a query row attends; the values are the C++ ``MaskKind``'s."""

    NONE = 0  # every key
    CAUSAL = 1  # keys up to the bottom-right-aligned diagonal
    LOCAL = 2  # keys inside a window around that diagonal


@dataclasses.dataclass(frozen=True, order=True)
class ProblemVariant:
    """Half of a kernel's registry key: the mask kind, whether the last query block and key/value
    tile may be partial (sequence lengths that are not multiples of the block sizes), whether
    the scores may be modified (softcap, ALiBi), whether each sequence of the batch has lengths
    of its own (varlen: cu_seqlens, seqused or leftpad), and whether K and V are an FP8 cache (e4m3
    values with dequantisation factors, beside 16-bit queries; varlen only)."""

    mask: MaskKind = MaskKind.NONE
    masked_tails: bool = False
    score_mods: bool = False
    varlen: bool = False
    kv_e4m3: bool = False

    def flags(self) -> tuple[bool, bool, bool, bool]:
        """The boolean fields, in the order of the C++ struct and the kernels' template arguments."""
        return (self.masked_tails, self.score_mods, self.varlen, self.kv_e4m3)

    def to_cpp_struct(self) -> str:
        """The C++ aggregate initializer, as the generator writes it."""
        flags = ", ".join("true" if flag else "false" for flag in self.flags())
        return f"ProblemVariant{{MaskKind::{self.mask.name}, {flags}}}"

    def describe(self) -> str:
        """How people say it: ``causal, masked tails``, ``no mask``, ..."""
        parts = [{MaskKind.NONE: "no mask", MaskKind.CAUSAL: "causal", MaskKind.LOCAL: "local"}[self.mask]]
        named = (
            ("masked tails", self.masked_tails),
            ("softcap/ALiBi", self.score_mods),
            ("varlen", self.varlen),
            ("e4m3 KV cache", self.kv_e4m3),
        )
        parts += [name for name, on in named if on]
        return ", ".join(parts)


# Every variant a kernel can be compiled for. Softcap and ALiBi come with masked tails only: that
# kernel serves any lengths, and problems that modify scores are rare enough not to need both.
ALL_VARIANTS = tuple(
    ProblemVariant(mask, masked_tails, score_mods)
    for mask in MaskKind
    for masked_tails in (False, True)
    for score_mods in (False, True)
    if masked_tails or not score_mods
)
# The variants of a batch whose sequences have lengths of their own: any lengths (masked tails),
# with and without score modifications.
VARLEN_VARIANTS = tuple(ProblemVariant(mask, True, score_mods, True) for mask in MaskKind for score_mods in (False, True))
# The same with K and V an FP8 cache (16-bit queries): what the SM80 family's decoding
# configurations are compiled with besides.
KV_E4M3_VARIANTS = tuple(dataclasses.replace(variant, kv_e4m3=True) for variant in VARLEN_VARIANTS)
# The variants the benchmark shapes need: unmasked and causal attention over whole blocks.
BENCHMARK_VARIANTS = (ProblemVariant(MaskKind.NONE), ProblemVariant(MaskKind.CAUSAL))
# The same over lengths that leave partial blocks: what the benchmark shapes need of a configuration
# whose block sizes do not divide them (B_c 176 at seq 4096).
BENCHMARK_TAIL_VARIANTS = tuple(dataclasses.replace(variant, masked_tails=True) for variant in BENCHMARK_VARIANTS)
# The benchmark lengths are multiples of this (tools/benchmark: 512 to 16384).
BENCHMARK_LENGTH_UNIT = 512


def needed_variant(
    cfg,
    seqlen_q: int,
    seqlen_k: int,
    causal: bool = False,
    window_size=(-1, -1),
    score_mods: bool = False,
    varlen: bool = False,
    d_head: int | None = None,
    kv_e4m3: bool = False,
) -> ProblemVariant:
    """The problem variant the binding runs ``cfg`` with for this problem (its rule, in Python, so
    tests and tools can pick the configurations that have it; the GPU tests check the two agree).

    The mask kind is NONE unless a window side bounds some row (a side reaching past every key is
    unbounded), CAUSAL for a bounded right side of 0 alone (causal sets right to 0), LOCAL
    otherwise. Masked tails where a length is not a multiple of the family's blocks or the call's
    ``d_head`` (default: ``cfg``'s) needs them (``cfg.needs_masked_tails``), and always with score
    mods (softcap or ALiBi), which are compiled with masked tails only. A varlen problem (seqlen_q and seqlen_k are then the largest sequence's)
    needs one of VARLEN_VARIANTS; an FP8 cache (``kv_e4m3``: e4m3 k and v, 16-bit q) one of
    KV_E4M3_VARIANTS, whether the call has per-sequence lengths or not."""
    mask = mask_kind(seqlen_q, seqlen_k, causal, window_size)
    if varlen or kv_e4m3:
        return ProblemVariant(mask, True, score_mods, True, kv_e4m3)
    masked_tails = score_mods or cfg.needs_masked_tails(seqlen_q, seqlen_k, d_head)
    return ProblemVariant(mask, masked_tails, score_mods)


def mask_kind(seqlen_q: int, seqlen_k: int, causal: bool = False, window_size=(-1, -1)) -> MaskKind:
    """The mask kind of a problem, the part of its variant that no configuration changes (see
    needed_variant)."""
    left, right = window_size
    if causal:
        right = 0
    left_bounded = 0 <= left < seqlen_k - 1  # the last query reaches key 0 otherwise
    right_bounded = 0 <= right < seqlen_q - 1  # the first query reaches the last key otherwise
    if not (left_bounded or right_bounded):
        return MaskKind.NONE
    if not left_bounded and right == 0:
        return MaskKind.CAUSAL
    return MaskKind.LOCAL


def attention_flop(batch: int, heads: int, seq_len: int, d_head: int) -> int:
    """FLOPs of the two matmuls (Q K^T and P V): the count every attention TFLOP/s figure uses."""
    return 4 * batch * heads * seq_len**2 * d_head


def total_flop(batch: int, heads: int, seq_len: int, d_head: int) -> int:
    """All floating-point work: the two matmuls (``attention_flop``), plus the online softmax's five
    elementwise operations per score (scale, max, subtract, exp, sum), plus normalising each output
    element by its row sum once at the end."""
    softmax = 5 * batch * heads * seq_len**2
    normalisation = batch * heads * seq_len * d_head
    return attention_flop(batch, heads, seq_len, d_head) + softmax + normalisation
