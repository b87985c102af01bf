"""The float32 reference and the correctness criteria shared by the tests and the tools.

The reference computes attention with FlashAttention-2's semantics (the kernels' own):
- q is (batch, seqlen_q, heads_q, d_head), k and v are (batch, seqlen_k, heads_kv, d_head); query
  head h reads key/value head h // (heads_q // heads_kv);
- the score of query i and key j is scale * q_i . k_j (scale defaults to 1/sqrt(d_head)), capped
  to softcap * tanh(score / softcap) when softcap > 0, then given the ALiBi bias
  -slope * |i + seqlen_k - seqlen_q - j| when slopes are given;
- masks are aligned to the bottom-right corner: with ``causal`` query i attends key j iff
  j <= i + seqlen_k - seqlen_q; ``window_size`` (left, right) keeps
  i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, -1 meaning unbounded
  on that side, and ``causal`` sets right to 0 (left still applies);
- a query row that attends no key outputs 0 and its log-sum-exp (lse) is +inf; lse is the natural
  log of sum_j exp(score_ij) over the attended keys, float32, (batch, heads_q, seqlen_q).

The output criterion is FlashAttention's own: an output may be off attention computed in float32
on the upcast inputs (ref32) by at most twice what computing in the input dtype itself costs
(ref16: the same math in float16/bfloat16, the ALiBi bias kept in float32 as FlashAttention's
reference does), plus 1e-5, and its relative norm error must be under 1e-2. What computing in the
input dtype costs is taken to be at least half a unit in the last place of the largest output
element (``rounding_floor``): any 16-bit output may be rounded that far, but over the few elements
of a small output (one query row of a few heads) ref16's maximum error is a noisy sample that may
fall well short of it, and a kernel as accurate as ref16 on average then fails by chance (a
one-query, 239-key, d_head 256 float16 problem with ALiBi: over 300 seeds the kernel's error was
0.81 of ref16's at the median and above twice it twice).

The lse criterion compares float32 with float32. The kernel reads the same (exactly upcast) inputs
as ref32, so the two differ only by float32 rounding: of the d_head-term dot products, each off by
at most about d_head * 2^-24 times scale * sum_d |q_d k_d| (the cap, tanh, only shrinks errors),
of the ALiBi bias, of the sum of exponentials and of the GPU's approximate exp2 and log2. lse is a
softmax-weighted mean of the scores to first order, so row i may be off by at most
``LSE_RTOL * (1 + E_i)``, where E_i = sum_j p_ij (scale * sum_d |q_id k_jd| + |alibi_ij|) is the
softmax-weighted magnitude of what the row's scores are computed from. LSE_RTOL = 2^-13 is eight
times float32's worst-case dot-product error at d_head 256, and far above the typical rounding of
sums over up to 16384 keys; a missing or doubled key tile moves lse by far more. Rows that attend
no key must be +inf exactly, and every other row finite.

FP8 inputs (``Fp8Reference``: float8_e4m3fn q, k and v with their descales) are compared with
attention in float32 on the dequantised inputs (each input's values times its descale for the
(batch, kv head); a query head's is its kv head's), as ref32. What computing in the input dtype
costs is not ref16 there: the kernel quantises P to e4m3 (3 mantissa bits) before P V, P scaled so
that a row's largest probability is 2^8 (P in [0, 256]). So a second reference emulates that: P =
exp(s - the row's true maximum) times 2^8, rounded to e4m3 and divided by 2^8, normalised by the
unrounded row sum, its output rounded to the output dtype (bfloat16 or float16). The output may be
off ref32 by at most twice what the emulation is off (at least half a unit in the last place of
the largest output element, as above), plus 2e-3: the kernel's P is quantised against the running
row maximum, rescaled as the maximum grows, rather than against the true one, and its output is
rounded once more. Its lse may be off by 1e-3 + FP8_LSE_RTOL * (1 + E_i), E_i as above: the 8-bit
products' sums in the tensor cores keep fewer bits than float32's, so the scores' rounding, which
the lse follows, is coarser (measured on the H200: rows off by up to about 2^-12 (1 + E_i), where
float32's criterion allows 2^-13 (1 + E_i)); FP8_LSE_RTOL = 2^-10 allows four times that.

An FP8 cache (``Fp8CacheReference``: float8_e4m3fn k and v with k_descale and v_descale beside 16-bit
q) is compared as 16-bit inputs are: ref32 is attention in float32 on q and the dequantised cache,
ref16 the same math in q's dtype on the dequantised cache rounded to it (what a 16-bit cache of
those values would hold). The kernels widen the e4m3 values exactly (to float16), multiply k's factor
into the softmax scale and v's into the output: with factors that are powers of two their computation
is that of the 16-bit cache but for float32 rounding order and, beside bfloat16 q, probabilities
rounded to float16 (finer than bfloat16), and otherwise no coarser.

Variable-length batches (``VarlenReference``) are references of the same kind, one per sequence:
each sequence's used query rows attend its used keys, with the masks and the ALiBi distance
aligned to that sequence's own lengths, and each sequence meets both criteria on its own (its own
ref16 error sets its tolerance), as it would if it had been called alone.

torch is imported inside the functions, so ``import flash_helpers`` stays free of it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

# Query rows per chunk are chosen so one chunk's scores hold this many elements (256 MiB in
# float32): the reference for seq 16384 then fits next to the inputs.
REFERENCE_CHUNK_ELEMENTS = 1 << 26
MAX_RELATIVE_NORM_ERROR = 1e-2
# See the module docstring: lse may be off by LSE_RTOL * (1 + the row's score magnitude).
LSE_RTOL = 2.0**-13
# The FP8 criterion (module docstring): the kernel's P scale, the output's absolute slack, and the
# lse's absolute slack and its tolerance relative to the row's score magnitude.
FP8_P_SCALE = 2.0**8
FP8_ABSOLUTE_SLACK = 2e-3
FP8_LSE_SLACK = 1e-3
FP8_LSE_RTOL = 2.0**-10


@dataclasses.dataclass(frozen=True, eq=False)
class Semantics:
    """The problem's keyword arguments (those of ``flash_attention.forward``), resolved: the scale
    given a value and the window's right side 0 under ``causal``."""

    softmax_scale: float
    window_left: int  # -1: unbounded
    window_right: int  # -1: unbounded
    softcap: float
    alibi_slopes: object  # None, or a float32 tensor (heads_q,) or (batch, heads_q)

    @classmethod
    def of(cls, d_head, *, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None):
        left, right = window_size
        return cls(
            softmax_scale=d_head**-0.5 if softmax_scale is None else float(softmax_scale),
            window_left=int(left),
            window_right=0 if causal else int(right),
            softcap=float(softcap),
            alibi_slopes=alibi_slopes,
        )


def attended(seqlen_q: int, seqlen_k: int, *, causal=False, window_size=(-1, -1), rows=None, device=None):
    """(len(rows), seqlen_k) bool tensor: whether query row i (of ``rows``, a range; all rows by
    default) attends key j."""
    semantics = Semantics.of(1, causal=causal, window_size=window_size)
    return _attended(semantics, range(seqlen_q) if rows is None else rows, seqlen_q, seqlen_k, device)


def _attended(semantics: Semantics, rows: range, seqlen_q: int, seqlen_k: int, device):
    import torch

    diagonal = torch.arange(rows.start, rows.stop, device=device)[:, None] + (seqlen_k - seqlen_q)
    keys = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones((len(rows), seqlen_k), dtype=torch.bool, device=device)
    if semantics.window_left >= 0:
        mask &= keys >= diagonal - semantics.window_left
    if semantics.window_right >= 0:
        mask &= keys <= diagonal + semantics.window_right
    return mask


def attention(q, k, v, dtype, *, return_lse=False, **semantics):
    """Attention with torch ops in ``dtype``, in the (batch, seq, heads, d_head) layout: o, or
    (o, lse) with ``return_lse``. ``semantics`` are ``flash_attention.forward``'s keywords
    (causal, softmax_scale, window_size, softcap, alibi_slopes). Computes every row at once; use
    FloatReference for long sequences."""
    resolved = Semantics.of(q.shape[-1], **semantics)
    rows = _Rows(q, k, v, dtype, resolved, range(q.shape[1]), q.shape[1], with_lse=return_lse)
    return (rows.out, rows.lse) if return_lse else rows.out


class _Rows:
    """Attention of a range of query rows (``q_rows`` holds only those rows); optionally their lse
    (float32) and the magnitudes their lse tolerances scale with."""

    def __init__(
        self,
        q_rows,
        k,
        v,
        dtype,
        semantics: Semantics,
        rows: range,
        seqlen_q: int,
        with_lse=False,
        magnitudes=False,
        e4m3_probabilities=False,
    ):
        import torch

        batch, n_rows, heads_q, d_head = q_rows.shape
        seqlen_k, heads_kv = k.shape[1], k.shape[2]
        group = heads_q // heads_kv
        # Grouped heads: (batch, heads_kv, group, rows, d_head) against (batch, heads_kv, 1, seqlen_k, d_head).
        q5 = q_rows.to(dtype).transpose(1, 2).reshape(batch, heads_kv, group, n_rows, d_head)
        k5, v5 = (t.to(dtype).transpose(1, 2).unsqueeze(2) for t in (k, v))

        scores = (q5 @ k5.transpose(-2, -1)) * semantics.softmax_scale
        if semantics.softcap > 0:
            scores = torch.tanh(scores / semantics.softcap) * semantics.softcap
        scores = scores.reshape(batch, heads_q, n_rows, seqlen_k)
        bias = None
        if semantics.alibi_slopes is not None:
            diagonal = torch.arange(rows.start, rows.stop, device=q_rows.device)[:, None] + (seqlen_k - seqlen_q)
            distance = (diagonal - torch.arange(seqlen_k, device=q_rows.device)[None, :]).abs().float()
            slopes = semantics.alibi_slopes.float().reshape(-1, heads_q, 1, 1)
            bias = -slopes * distance  # float32: with it, the scores become float32 too
            scores = scores + bias
        mask = _attended(semantics, rows, seqlen_q, seqlen_k, q_rows.device)
        self.without_keys = ~mask.any(dim=-1)  # (rows,)
        scores = scores.masked_fill(~mask, float("-inf"))
        # A row without keys is all -inf, whose softmax is NaN: it outputs 0.
        probabilities = _e4m3_probabilities(scores) if e4m3_probabilities else scores.softmax(dim=-1)
        probabilities = probabilities.masked_fill(self.without_keys[:, None], 0.0)
        grouped = probabilities.to(dtype).reshape(batch, heads_kv, group, n_rows, seqlen_k)
        self.out = (grouped @ v5).reshape(batch, heads_q, n_rows, d_head).transpose(1, 2)

        self.lse = None
        if with_lse:
            self.lse = torch.logsumexp(scores.float(), dim=-1).masked_fill(self.without_keys, math.inf)
        self.magnitude = None
        if magnitudes:
            # E_i of the module docstring: the softmax-weighted magnitude of the scores' terms.
            terms = (q5.float().abs() @ k5.float().abs().transpose(-2, -1)) * semantics.softmax_scale
            terms = terms.reshape(batch, heads_q, n_rows, seqlen_k)
            if bias is not None:
                terms = terms + bias.abs()
            self.magnitude = (probabilities.float() * terms).sum(dim=-1)


def _e4m3_probabilities(scores):
    """The softmax as the FP8 kernels' P V operand has it: exp(s - the row's maximum) times
    FP8_P_SCALE rounded to e4m3, over the unrounded row sum."""
    import torch

    if scores.shape[-1] == 0:  # rows of a sequence without keys: nothing to round
        return scores
    unnormalised = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    rounded = (unnormalised * FP8_P_SCALE).to(torch.float8_e4m3fn).float() / FP8_P_SCALE
    return rounded / unnormalised.sum(dim=-1, keepdim=True)


def dequantize(t, descale):
    """The float32 values of an FP8 tensor (batch, seq, heads, d_head) times its descale (batch,
    heads_kv) (None: 1): head h of ``heads`` takes kv head h // (heads // heads_kv)'s factor, so q's
    grouped heads share their kv head's."""
    values = t.float()
    if descale is None:
        return values
    factors = descale.float().to(t.device).repeat_interleave(t.shape[2] // descale.shape[1], dim=1)
    return values * factors[:, None, :, None]


def _max_abs(t):
    """max |t| as a 0-d tensor (0 for an empty tensor); NaN propagates."""
    import torch

    return t.abs().max() if t.numel() else torch.zeros((), device=t.device)


def half_ulp(value: float, dtype) -> float:
    """Half the spacing of ``dtype``'s numbers at |value|: the most that rounding |value| to ``dtype``
    may move it (0 for 0 and for what is not finite, which fails the comparison anyway)."""
    import torch

    if value == 0 or not math.isfinite(value):
        return 0.0
    finfo = torch.finfo(dtype)
    # Below the smallest normal number the spacing is the subnormals': tiny * eps.
    return finfo.eps * 2.0 ** math.floor(math.log2(max(abs(value), finfo.tiny))) / 2


@dataclasses.dataclass
class ReferenceComparison:
    """How far one output is from the reference, and whether that passes the criterion."""

    max_error: float  # max |out - ref32|
    ref16_max_error: float  # max |ref16 - ref32| (FP8 inputs: max |emulation - ref32|)
    relative_norm_error: float  # ||out - ref32|| / ||ref32|| (0 where both are 0)
    rounding_floor: float  # half a unit in the last place of max |ref32| in the output dtype
    absolute_slack: float = 1e-5
    max_relative_norm_error: float | None = MAX_RELATIVE_NORM_ERROR  # None: not bounded (FP8 inputs)

    @property
    def tolerance(self) -> float:
        return 2 * max(self.ref16_max_error, self.rounding_floor) + self.absolute_slack

    @property
    def passed(self) -> bool:
        # Written so that NaN errors fail.
        bounded = self.max_relative_norm_error is None or self.relative_norm_error < self.max_relative_norm_error
        return self.max_error <= self.tolerance and bounded

    def describe(self) -> str:
        allowed = "" if self.max_relative_norm_error is None else f" (allowed {self.max_relative_norm_error:g})"
        return (
            f"max error {self.max_error:.3g} (allowed {self.tolerance:.3g}), relative norm error "
            f"{self.relative_norm_error:.3g}{allowed}"
        )


@dataclasses.dataclass
class LseComparison:
    """How far one lse is from the float32 reference's, and whether that passes the criterion."""

    shape_matches: bool  # (batch, heads_q, seqlen_q), float32
    infinities_match: bool  # +inf exactly on the rows without keys
    max_error: float  # max |lse - ref| over the rows with keys (NaN if any is NaN)
    tolerance: float  # what the row with the largest error relative to its tolerance was allowed
    worst_ratio: float  # max over those rows of |lse - ref| / tolerance

    @property
    def passed(self) -> bool:
        return self.shape_matches and self.infinities_match and self.worst_ratio <= 1.0

    def describe(self) -> str:
        if not self.shape_matches:
            return "lse has the wrong shape or dtype"
        infinities = "" if self.infinities_match else "+inf on the wrong rows (or NaN); "
        return (
            f"{infinities}lse max error {self.max_error:.3g}; the worst row is off by {self.worst_ratio:.3g} "
            f"times its tolerance {self.tolerance:.3g}"
        )


class FloatReference:
    """The reference of one input, computed once (chunk by chunk over query rows, so long sequences
    fit) and then compared with any number of outputs and lse. The keywords are
    ``flash_attention.forward``'s (causal, softmax_scale, window_size, softcap, alibi_slopes). q, k
    and v are 16-bit (FP8 ones have Fp8Reference)."""

    # The criterion's slack and bounds (module docstring; Fp8Reference has its own).
    ABSOLUTE_SLACK = 1e-5
    MAX_RELATIVE_NORM_ERROR = MAX_RELATIVE_NORM_ERROR
    LSE_RTOL = LSE_RTOL
    LSE_SLACK = 0.0

    def __init__(self, q, k, v, **semantics):
        import torch

        if q.dtype == torch.float8_e4m3fn:
            raise TypeError("q: float8_e4m3fn inputs have their own reference, Fp8Reference")
        self._compute(q, k, v, q.dtype, semantics)

    def _cheap_rows(self, q_rows, k, v, rows: range, seqlen_q: int):
        """These rows computed as cheaply as the kernel may: the same math in the input dtype (ref16)."""
        return _Rows(q_rows, k, v, q_rows.dtype, self.semantics, rows, seqlen_q).out.float()

    def _compute(self, q, k, v, out_dtype, semantics: dict) -> None:
        """ref32, lse and their tolerances, of the values q, k and v hold, for an output of out_dtype."""
        import torch

        batch, seqlen_q, heads_q, d_head = q.shape
        seqlen_k = k.shape[1]
        if k.shape != v.shape or k.shape[2] == 0 or heads_q % k.shape[2] != 0:
            raise ValueError(
                f"k and v {tuple(k.shape)}, {tuple(v.shape)} must be one (batch, seqlen_k, heads_kv, d_head) shape "
                f"with heads_kv dividing heads_q ({heads_q})"
            )
        self.semantics = Semantics.of(d_head, **semantics)
        rows_per_chunk = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, batch * heads_q * seqlen_k))
        self.ref32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        self.lse = torch.empty((batch, heads_q, seqlen_q), dtype=torch.float32, device=q.device)
        self.lse_tolerance = torch.empty_like(self.lse)
        # (seqlen_q,) bool: the query rows that attend no key (in every batch and head).
        self.rows_without_keys = torch.empty(seqlen_q, dtype=torch.bool, device=q.device)
        # A 0-d tensor, not a float: torch.maximum propagates NaN where Python's max() would drop it.
        ref16_max_error = torch.zeros((), device=q.device)
        k32, v32 = k.float(), v.float()
        for start in range(0, seqlen_q, rows_per_chunk):
            rows = range(start, min(seqlen_q, start + rows_per_chunk))
            q_rows = q[:, rows.start : rows.stop]
            ref32 = _Rows(
                q_rows, k32, v32, torch.float32, self.semantics, rows, seqlen_q, with_lse=True, magnitudes=True
            )
            ref16 = self._cheap_rows(q_rows, k, v, rows, seqlen_q)
            ref16_max_error = torch.maximum(ref16_max_error, _max_abs(ref16 - ref32.out))
            self.ref32[:, rows.start : rows.stop] = ref32.out
            self.lse[:, :, rows.start : rows.stop] = ref32.lse
            self.lse_tolerance[:, :, rows.start : rows.stop] = self.LSE_RTOL * (1 + ref32.magnitude) + self.LSE_SLACK
            self.rows_without_keys[rows.start : rows.stop] = ref32.without_keys
        self.ref16_max_error = ref16_max_error.item()
        self.rounding_floor = half_ulp(_max_abs(self.ref32).item(), out_dtype)
        self._ref32_norm = self.ref32.double().norm().item()

    @property
    def lse_shape(self) -> tuple[int, ...]:
        """The shape the call's lse has: (batch, heads_q, seqlen_q)."""
        return tuple(self.lse.shape)

    def outputs_without_keys(self, out):
        """The elements of ``out`` that must be exactly 0: the rows that attend no key."""
        return out[:, self.rows_without_keys]

    def compare(self, out) -> ReferenceComparison:
        error = out.float() - self.ref32
        error_norm = error.double().norm().item()
        if self._ref32_norm > 0:
            relative = error_norm / self._ref32_norm
        else:
            # An all-zero reference (no row attends a key): only an exact match passes; NaN stays NaN.
            relative = error_norm if math.isnan(error_norm) else (0.0 if error_norm == 0 else math.inf)
        return ReferenceComparison(
            max_error=_max_abs(error).item(),
            ref16_max_error=self.ref16_max_error,
            relative_norm_error=relative,
            rounding_floor=self.rounding_floor,
            absolute_slack=self.ABSOLUTE_SLACK,
            max_relative_norm_error=self.MAX_RELATIVE_NORM_ERROR,
        )

    def compare_lse(self, lse) -> LseComparison:
        import torch

        if lse.shape != self.lse.shape or lse.dtype != torch.float32:
            return LseComparison(False, False, math.nan, math.nan, math.nan)
        lse = lse.to(self.lse.device)
        expected_inf = self.rows_without_keys.expand_as(self.lse)
        infinities_match = bool(torch.equal(lse == math.inf, expected_inf)) and not lse.isnan().any().item()
        finite = ~expected_inf
        error = (lse - self.lse)[finite].abs()  # inf or NaN where lse is not finite: those fail
        ratio = error / self.lse_tolerance[finite]
        if ratio.numel() == 0:
            return LseComparison(True, infinities_match, 0.0, 0.0, 0.0)
        worst = ratio.nan_to_num(nan=math.inf).argmax()
        return LseComparison(
            shape_matches=True,
            infinities_match=infinities_match,
            max_error=_max_abs(error).item(),
            tolerance=self.lse_tolerance[finite][worst].item(),
            worst_ratio=ratio[worst].item(),
        )


class Fp8Reference(FloatReference):
    """The reference of FP8 inputs (module docstring): float8_e4m3fn q, k and v, dequantised by
    q_descale, k_descale and v_descale ((batch, heads_kv) float32, None: 1), for an output of
    out_dtype (a torch dtype, bfloat16 by default); the other keywords are FloatReference's.
    ``ref16_max_error`` is the emulation's error: P rounded to e4m3 as the kernel rounds it."""

    ABSOLUTE_SLACK = FP8_ABSOLUTE_SLACK
    MAX_RELATIVE_NORM_ERROR = None
    LSE_RTOL = FP8_LSE_RTOL
    LSE_SLACK = FP8_LSE_SLACK

    def __init__(self, q, k, v, *, q_descale=None, k_descale=None, v_descale=None, out_dtype=None, **semantics):
        import torch

        if not q.dtype == k.dtype == v.dtype == torch.float8_e4m3fn:
            raise TypeError(f"q, k, v: expected float8_e4m3fn tensors, got {q.dtype}, {k.dtype}, {v.dtype}")
        self.out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        dequantized = (dequantize(t, descale) for t, descale in ((q, q_descale), (k, k_descale), (v, v_descale)))
        self._compute(*dequantized, self.out_dtype, semantics)

    def _cheap_rows(self, q_rows, k, v, rows: range, seqlen_q: int):
        """The emulation: P rounded to e4m3 before P V, the output rounded to out_dtype."""
        import torch

        emulated = _Rows(q_rows, k, v, torch.float32, self.semantics, rows, seqlen_q, e4m3_probabilities=True).out
        return emulated.to(self.out_dtype).float()


class Fp8CacheReference(FloatReference):
    """The reference of an FP8 cache (module docstring): 16-bit q against float8_e4m3fn k and v,
    dequantised by k_descale and v_descale ((batch, heads_kv) float32, None: 1); the other keywords
    are FloatReference's."""

    def __init__(self, q, k, v, *, k_descale=None, v_descale=None, **semantics):
        import torch

        if q.dtype == torch.float8_e4m3fn or not k.dtype == v.dtype == torch.float8_e4m3fn:
            raise TypeError(f"q, k, v: expected 16-bit q and float8_e4m3fn k and v, got {q.dtype}, {k.dtype}, {v.dtype}")
        self._compute(q, dequantize(k, k_descale), dequantize(v, v_descale), q.dtype, semantics)

    def _cheap_rows(self, q_rows, k, v, rows: range, seqlen_q: int):
        """The same math in q's dtype, on the dequantised cache rounded to it."""
        dtype = q_rows.dtype
        return _Rows(q_rows, k.to(dtype), v.to(dtype), dtype, self.semantics, rows, seqlen_q).out.float()


def _dense_reference(q, k, v, **keywords):
    """The reference class of dense tensors of these dtypes: Fp8Reference for float8_e4m3fn q,
    Fp8CacheReference for float8_e4m3fn k and v beside 16-bit q, FloatReference otherwise."""
    import torch

    if q.dtype == torch.float8_e4m3fn:
        return Fp8Reference(q, k, v, **keywords)
    if k.dtype == torch.float8_e4m3fn:
        return Fp8CacheReference(q, k, v, **keywords)
    return FloatReference(q, k, v, **keywords)


# ----------------------------------------------------------------------------------------------
# Variable-length batches

# flash_attention.forward's keywords that make a call variable-length.
VARLEN_KEYWORDS = (
    "cu_seqlens_q",
    "cu_seqlens_k",
    "max_seqlen_q",
    "max_seqlen_k",
    "seqused_q",
    "seqused_k",
    "leftpad_q",
    "leftpad_k",
)


def reference_for_call(q, k, v, **keywords):
    """The reference of a ``flash_attention.forward`` call from its tensors and keywords (return_lse
    aside): a VarlenReference where any of VARLEN_KEYWORDS is given, otherwise by the inputs'
    dtypes an Fp8Reference (float8_e4m3fn inputs), an Fp8CacheReference (an FP8 cache beside
    16-bit q) or a FloatReference."""
    varlen = {name: keywords.pop(name) for name in VARLEN_KEYWORDS if name in keywords}
    if any(value is not None for value in varlen.values()):
        return VarlenReference.of_call(q, k, v, **varlen, **keywords)
    return _dense_reference(q, k, v, **keywords)


@dataclasses.dataclass(frozen=True)
class SequenceRows:
    """Where sequence ``index`` of a variable-length batch lies in the packed (total, heads, d_head)
    tensors: the rows of q and o its used queries are, and the rows of k and v its used keys are."""

    index: int
    q: range
    k: range


def cu_seqlens_slots(cu_seqlens: Sequence[int], total: int, name: str) -> list[range]:
    """The slots [cu_seqlens[b], cu_seqlens[b + 1]) of a packed tensor of ``total`` rows. Raises
    ValueError, naming ``name``, where the prefix sums decrease or leave the tensor."""
    cu_seqlens = [int(value) for value in cu_seqlens]
    if not cu_seqlens or cu_seqlens[0] < 0 or cu_seqlens[-1] > total:
        raise ValueError(f"{name}: {cu_seqlens} must start at 0 or later and end at {total} rows or before")
    if any(end < start for start, end in zip(cu_seqlens, cu_seqlens[1:])):
        raise ValueError(f"{name}: {cu_seqlens} decreases")
    return [range(start, end) for start, end in zip(cu_seqlens, cu_seqlens[1:])]


def used_rows(slots: Sequence[range], seqused=None, leftpad=None, max_seqlen=None, side: str = "q") -> list[range]:
    """The rows each sequence uses inside its slot: from leftpad[b] rows past the slot's start,
    seqused[b] rows (without seqused, the rest of the slot). Raises ValueError, naming the
    argument, where they leave the slot or number more than max_seqlen: the reference computes
    well-formed batches only (the kernels do not compute rows past max_seqlen)."""
    used = []
    for b, slot in enumerate(slots):
        left = 0 if leftpad is None else int(leftpad[b])
        length = len(slot) - left if seqused is None else int(seqused[b])
        if left < 0 or left > len(slot):
            raise ValueError(f"leftpad_{side}: sequence {b} starts {left} rows into a slot of {len(slot)}")
        if length < 0 or left + length > len(slot):
            raise ValueError(
                f"seqused_{side}: sequence {b} uses {length} rows from row {left} of a slot of {len(slot)}"
            )
        if max_seqlen is not None and length > max_seqlen:
            raise ValueError(f"max_seqlen_{side}: {max_seqlen}, but sequence {b} uses {length} rows")
        used.append(range(slot.start + left, slot.start + left + length))
    return used


@dataclasses.dataclass
class SequenceComparisons:
    """One comparison (of outputs or of lse) of a variable-length batch: per compared sequence its
    comparison, and whether the rows outside every sequence hold what they must."""

    per_sequence: list  # (SequenceRows, ReferenceComparison or LseComparison)
    outside_failure: str | None = None  # what is wrong outside the sequences (or with the shape)

    @property
    def passed(self) -> bool:
        return self.outside_failure is None and all(comparison.passed for _, comparison in self.per_sequence)

    def describe(self) -> str:
        failures = [
            f"sequence {rows.index} ({len(rows.q)} queries, {len(rows.k)} keys): {comparison.describe()}"
            for rows, comparison in self.per_sequence
            if not comparison.passed
        ]
        if self.outside_failure is not None:
            failures.insert(0, self.outside_failure)
        if not failures:
            return f"all {len(self.per_sequence)} sequences pass"
        more = f"; and {len(failures) - 3} more" if len(failures) > 3 else ""
        return "; ".join(failures[:3]) + more


class VarlenReference:
    """The reference of a variable-length call: one FloatReference per sequence (an Fp8Reference
    for FP8 inputs, an Fp8CacheReference for an FP8 cache), on its used query rows against its used
    key rows, with per-(batch, head) ALiBi slopes and descales taking the sequence's row.

    ``q``, ``k`` and ``v`` are packed, (total_q, heads_q, d_head) and (total_k, heads_kv, d_head);
    ``sequences`` say where each sequence lies; ``ref32`` and ``lse`` are the sequences' references
    put together in the packed layout. With ``zero_outside`` (seqused or leftpad given),
    every row of o outside the sequences' used rows must be 0 and its lse +inf; otherwise those rows
    are not compared. ``padded_shape`` (batch, seqlen_q) says that the call's q, o and lse were 4-D
    (each sequence in a slot of its own), which the comparisons then take as they are.
    """

    def __init__(
        self, q, k, v, sequences: Sequence[SequenceRows], *, zero_outside=False, padded_shape=None, **semantics
    ):
        import torch

        slopes = semantics.pop("alibi_slopes", None)
        descales = {
            name: semantics.pop(name)
            for name in ("q_descale", "k_descale", "v_descale")
            if semantics.get(name) is not None
        }
        self.sequences = list(sequences)
        self.zero_outside = zero_outside
        self._padded_shape = padded_shape
        total_q, heads_q = q.shape[0], q.shape[1]
        self.lse_shape = (heads_q, total_q) if padded_shape is None else (padded_shape[0], heads_q, padded_shape[1])
        self._references = []
        # Packed, as the sequences' references put together: 0 and +inf on the rows of no sequence.
        self.ref32 = torch.zeros((total_q, heads_q, q.shape[2]), dtype=torch.float32, device=q.device)
        self.lse = torch.full((heads_q, total_q), math.inf, dtype=torch.float32, device=q.device)
        in_a_sequence = torch.zeros(total_q, dtype=torch.bool, device=q.device)
        without_keys = torch.zeros_like(in_a_sequence)
        for rows in self.sequences:
            row_slopes = slopes[rows.index] if slopes is not None and slopes.dim() == 2 else slopes
            queries, keys = slice(rows.q.start, rows.q.stop), slice(rows.k.start, rows.k.stop)
            row_descales = {name: descale[rows.index : rows.index + 1] for name, descale in descales.items()}
            reference = _dense_reference(
                q[None, queries], k[None, keys], v[None, keys], alibi_slopes=row_slopes, **row_descales, **semantics
            )
            self._references.append(reference)
            self.ref32[queries] = reference.ref32[0]
            self.lse[:, queries] = reference.lse[0]
            in_a_sequence[queries] = True
            without_keys[queries] = reference.rows_without_keys
        self.outside = ~in_a_sequence  # the packed rows of no sequence
        self._zero_rows = without_keys | self.outside if zero_outside else without_keys

    @classmethod
    def of_call(
        cls,
        q,
        k,
        v,
        *,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        seqused_q=None,
        seqused_k=None,
        leftpad_q=None,
        leftpad_k=None,
        **semantics,
    ):
        """The reference of ``flash_attention.forward(cfg, q, k, v, **keywords)``: with cu_seqlens_q
        and cu_seqlens_k, q, k and v are packed and sequence b's slots are rows [cu_seqlens[b],
        cu_seqlens[b + 1]); without them they are 4-D and sequence b's slot is batch entry b. Inside
        a slot, a sequence uses seqused rows from leftpad rows in (``used_rows``)."""
        values = lambda t: None if t is None else t.tolist()  # noqa: E731
        if cu_seqlens_q is not None:
            slots_q = cu_seqlens_slots(values(cu_seqlens_q), q.shape[0], "cu_seqlens_q")
            slots_k = cu_seqlens_slots(values(cu_seqlens_k), k.shape[0], "cu_seqlens_k")
            padded_shape = None
        else:
            (batch, seqlen_q), seqlen_k = q.shape[:2], k.shape[1]
            slots_q = [range(b * seqlen_q, (b + 1) * seqlen_q) for b in range(batch)]
            slots_k = [range(b * seqlen_k, (b + 1) * seqlen_k) for b in range(batch)]
            q, k, v = (t.flatten(0, 1) for t in (q, k, v))
            padded_shape = (batch, seqlen_q)
        if len(slots_q) != len(slots_k):
            raise ValueError(f"cu_seqlens_k: {len(slots_k)} sequences, and cu_seqlens_q {len(slots_q)}")
        rows_q = used_rows(slots_q, values(seqused_q), values(leftpad_q), max_seqlen_q, "q")
        rows_k = used_rows(slots_k, values(seqused_k), values(leftpad_k), max_seqlen_k, "k")
        sequences = [SequenceRows(b, *rows) for b, rows in enumerate(zip(rows_q, rows_k))]
        zero_outside = any(t is not None for t in (seqused_q, seqused_k, leftpad_q, leftpad_k))
        return cls(q, k, v, sequences, zero_outside=zero_outside, padded_shape=padded_shape, **semantics)

    def _chosen(self, indices) -> list:
        pairs = list(zip(self.sequences, self._references))
        return pairs if indices is None else [pair for pair in pairs if pair[0].index in set(indices)]

    def _packed_out(self, out):
        return out if self._padded_shape is None else out.flatten(0, 1)

    def _packed_lse(self, lse):
        # (batch, heads_q, seqlen_q) -> (heads_q, batch * seqlen_q): the packed rows' order.
        return lse if self._padded_shape is None else lse.transpose(0, 1).flatten(1)

    def compare(self, out, sequences=None) -> SequenceComparisons:
        """Each sequence's rows of ``out`` against its reference (only ``sequences``, indices, if
        given); with zero_outside and every sequence compared, the rows outside them must be 0."""
        packed = self._packed_out(out)
        results = [
            (rows, reference.compare(packed[None, rows.q.start : rows.q.stop]))
            for rows, reference in self._chosen(sequences)
            if len(rows.q)
        ]
        failure = None
        if self.zero_outside and sequences is None and not bool((packed[self.outside] == 0).all()):
            failure = "rows outside every sequence's used rows are not 0"
        return SequenceComparisons(results, failure)

    def compare_lse(self, lse, sequences=None) -> SequenceComparisons:
        """Each sequence's lse against its reference (as ``compare``); with zero_outside, the rows
        outside every sequence must be +inf."""
        import torch

        if tuple(lse.shape) != self.lse_shape or lse.dtype != torch.float32:
            return SequenceComparisons([], f"lse is {tuple(lse.shape)} {lse.dtype}, not {self.lse_shape} float32")
        packed = self._packed_lse(lse).to(self.outside.device)
        results = [
            (rows, reference.compare_lse(packed[None, :, rows.q.start : rows.q.stop]))
            for rows, reference in self._chosen(sequences)
            if len(rows.q)
        ]
        failure = None
        if self.zero_outside and sequences is None and not bool((packed[:, self.outside] == math.inf).all()):
            failure = "lse is not +inf on the rows outside every sequence's used rows"
        return SequenceComparisons(results, failure)

    def outputs_without_keys(self, out):
        """The elements of ``out`` that must be exactly 0: the rows that attend no key and, with
        zero_outside, the rows outside every sequence."""
        return self._packed_out(out)[self._zero_rows]
