"""The element types of q, k, v and o, shared by every kernel family.

Importable without torch: only ``DType.to_torch_dtype`` and ``DType.from_torch_dtype`` import it,
lazily.
"""

from __future__ import annotations

import enum

__all__ = ["DTYPES", "DType", "coerce_dtype"]


class DType(enum.IntEnum):
    """Element type of q, k, v and o.

    The values are torch's ``ScalarType`` codes, so the C++ side can compare them with a tensor's
    ``scalar_type()`` and this module needs no torch to name them.
    """

    FP16 = 5
    BF16 = 15

    def to_cpp_str(self) -> str:
        """The C++ enumerator, as written inside ``namespace flash`` (e.g. ``DType::FP16``)."""
        return f"DType::{self.name}"

    def to_torch_dtype(self):
        """The matching ``torch.dtype``; imports torch only when called."""
        import torch

        return {DType.FP16: torch.float16, DType.BF16: torch.bfloat16}[self]

    @staticmethod
    def from_torch_dtype(torch_dtype) -> DType:
        """The DType of a ``torch.dtype``; ValueError for any other floating-point type."""
        import torch

        if not isinstance(torch_dtype, torch.dtype):
            raise TypeError(f"expected a torch.dtype, got {type(torch_dtype).__name__}")
        return DType.from_string(str(torch_dtype))

    @staticmethod
    def from_string(text: str) -> DType:
        """Parse a dtype name as people write it: ``FP16``, ``half``, ``torch.bfloat16``, ... (any case)."""
        try:
            return _DTYPE_NAMES[text.strip().lower()]
        except KeyError:
            accepted = ", ".join(sorted(_DTYPE_NAMES))
            raise ValueError(f"unsupported dtype {text!r}; expected one of: {accepted}") from None


_DTYPE_NAMES = {
    "fp16": DType.FP16,
    "float16": DType.FP16,
    "half": DType.FP16,
    "torch.float16": DType.FP16,
    "bf16": DType.BF16,
    "bfloat16": DType.BF16,
    "torch.bfloat16": DType.BF16,
}

DTYPES = (DType.FP16, DType.BF16)


def coerce_dtype(value) -> DType:
    """Accept a DType, its torch ScalarType code or its name, so configs can be built from plain data."""
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        return DType.from_string(value)
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return DType(value)
        except ValueError:
            codes = ", ".join(f"{member.value} ({member.name})" for member in DType)
            raise ValueError(f"dtype code {value} is not supported; expected one of {codes}") from None
    raise TypeError(f"dtype must be a DType, its code or its name, got {type(value).__name__} {value!r}")
