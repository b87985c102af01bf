"""The float32 reference and the correctness criterion shared by the tests and the tools.

The criterion is FlashAttention's own: an output may be off attention computed in float32 on the
upcast inputs (ref32) by at most twice what computing in the input dtype itself costs (ref16, the
same math in float16/bfloat16), plus 1e-5, and its relative norm error must be under 1e-2.

torch is imported inside the functions, so ``import flash_helpers`` stays free of it.
"""

from __future__ import annotations

import dataclasses

# Query rows per chunk are chosen so one chunk's scores hold this many elements (256 MiB in
# float32): the reference for seq 16384 then fits next to the inputs.
REFERENCE_CHUNK_ELEMENTS = 1 << 26
MAX_RELATIVE_NORM_ERROR = 1e-2


def attention(q, k, v, dtype):
    """softmax(q k^T / sqrt(d_head)) v with torch ops in ``dtype``, in the (batch, seq, heads, d_head) layout."""
    q, k, v = (t.to(dtype).transpose(1, 2) for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return (scores.softmax(dim=-1) @ v).transpose(1, 2)


@dataclasses.dataclass
class ReferenceComparison:
    """How far one output is from the reference, and whether that passes the criterion."""

    max_error: float  # max |out - ref32|
    ref16_max_error: float  # max |ref16 - ref32|
    relative_norm_error: float  # ||out - ref32|| / ||ref32||

    @property
    def tolerance(self) -> float:
        return 2 * self.ref16_max_error + 1e-5

    @property
    def passed(self) -> bool:
        # Written so that NaN errors fail.
        return self.max_error <= self.tolerance and self.relative_norm_error < MAX_RELATIVE_NORM_ERROR


class FloatReference:
    """The reference of one input, computed once (chunk by chunk over query rows, so long sequences
    fit) and then compared with any number of outputs."""

    def __init__(self, q, k, v):
        import torch

        batch, seq_len, heads, _ = q.shape
        rows = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, batch * heads * seq_len))
        self.ref32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
        # A 0-d tensor, not a float: torch.maximum propagates NaN where Python's max() would drop it.
        ref16_max_error = torch.zeros((), device=q.device)
        for start in range(0, seq_len, rows):
            q_rows = q[:, start : start + rows]
            ref32 = attention(q_rows, k, v, torch.float32)
            ref16 = attention(q_rows, k, v, q.dtype).float()
            ref16_max_error = torch.maximum(ref16_max_error, (ref16 - ref32).abs().max())
            self.ref32[:, start : start + rows] = ref32
        self.ref16_max_error = ref16_max_error.item()
        self._ref32_norm = self.ref32.double().norm()

    def compare(self, out) -> ReferenceComparison:
        error = out.float() - self.ref32
        return ReferenceComparison(
            max_error=error.abs().max().item(),
            ref16_max_error=self.ref16_max_error,
            relative_norm_error=(error.double().norm() / self._ref32_norm).item(),
        )
