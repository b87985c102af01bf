"""The element types of q, k, v and o, shared by every kernel family.

Importable without torch: only ``DType.to_torch_dtype`` and ``DType.from_torch_dtype`` import it,
lazily.
"""

from __future__ import annotations

import enum

__all__ = ["DEFAULT_FP8_OUTPUT", "DTYPES", "FP8_DTYPES", "DType", "coerce_dtype", "output_dtype"]


class DType(enum.IntEnum):
    """Element type of q, k and v (and of o, for the 16-bit types).

    The values are torch's ``ScalarType`` codes, so the C++ side can compare them with a tensor's
    ``scalar_type()`` and this module needs no torch to name them.
    """

    FP16 = 5
    BF16 = 15
    # torch.float8_e4m3fn: q, k and v of the Hopper family, or an FP8 cache's k and v beside 16-bit q
    # (the SM80 family's decoding configurations), with dequantisation factors (descales); the
    # output is 16-bit (output_dtype).
    E4M3 = 24

    @property
    def element_bytes(self) -> int:
        """Bytes of one element (the C++ ``element_bytes``)."""
        return 1 if self is DType.E4M3 else 2

    @property
    def torch_name(self) -> str:
        """torch's name of the type, as messages spell it (``float16``, ``float8_e4m3fn``)."""
        return {DType.FP16: "float16", DType.BF16: "bfloat16", DType.E4M3: "float8_e4m3fn"}[self]

    def to_cpp_str(self) -> str:
        """The C++ enumerator, as written inside ``namespace flash`` (e.g. ``DType::FP16``)."""
        return f"DType::{self.name}"

    def to_torch_dtype(self):
        """The matching ``torch.dtype``; imports torch only when called."""
        import torch

        return getattr(torch, self.torch_name)

    @staticmethod
    def from_torch_dtype(torch_dtype) -> DType:
        """The DType of a ``torch.dtype``; ValueError for any other floating-point type."""
        import torch

        if not isinstance(torch_dtype, torch.dtype):
            raise TypeError(f"expected a torch.dtype, got {type(torch_dtype).__name__}")
        return DType.from_string(str(torch_dtype))

    @staticmethod
    def from_string(text: str) -> DType:
        """Parse a dtype name as people write it: ``FP16``, ``half``, ``torch.bfloat16``, ``e4m3``, ...
        (any case)."""
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
    "e4m3": DType.E4M3,
    "fp8": DType.E4M3,
    "float8_e4m3fn": DType.E4M3,
    "torch.float8_e4m3fn": DType.E4M3,
}

# The 16-bit types: what every family runs, and what the sweeps and the benchmarks measure.
DTYPES = (DType.FP16, DType.BF16)
# The 8-bit types: the Hopper family's alone.
FP8_DTYPES = (DType.E4M3,)
# The output's dtype of FP8 inputs where the call asks for none (FlashAttention-3's).
DEFAULT_FP8_OUTPUT = DType.BF16


def output_dtype(dtype: DType, out_dtype: DType | None = None) -> DType:
    """The dtype of o for inputs of ``dtype``: the inputs' own for a 16-bit type (``out_dtype`` may
    only repeat it); for an FP8 type the 16-bit type ``out_dtype`` names, BF16 where it is None.
    ValueError naming out_dtype otherwise (the binding's rule, binding/fp8.h)."""
    if dtype in FP8_DTYPES:
        if out_dtype is None:
            return DEFAULT_FP8_OUTPUT
        if out_dtype not in DTYPES:
            raise ValueError(
                f"out_dtype: must be float16 or bfloat16 for float8_e4m3fn inputs, got {out_dtype.torch_name}"
            )
        return out_dtype
    if out_dtype is not None and out_dtype != dtype:
        raise ValueError(
            f"out_dtype: chooses the output's dtype of float8_e4m3fn inputs only; {dtype.torch_name} inputs give a "
            f"{dtype.torch_name} output, got {out_dtype.torch_name}"
        )
    return dtype


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
