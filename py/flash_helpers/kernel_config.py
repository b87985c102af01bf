"""What every kernel family's configuration shares: the type checks made at construction, one order
across families, validation built on the family's ``validity_error()``, and the spelling of field
values in the C++ initializer and in the kernel's demangled and mangled names. Importable without
torch.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import ClassVar

from flash_helpers.dtypes import DType, coerce_dtype
from flash_helpers.problem import ProblemVariant

__all__ = ["KernelConfig", "demangled_variant", "mangled_variant"]


class KernelConfig:
    """The base of every family's configuration: a frozen dataclass whose first field is ``dtype``
    and whose other fields are ints and bools, in the order of the family's C++ struct.

    Configurations sort by family name, then by their fields in order (dtype by its code, False <
    True), so sorting here and iterating a family's ``std::map`` agree, and sets that span families
    sort too. The subclasses are dataclasses without ``order=True``: the comparisons it generates
    refuse a configuration of another class. Construction checks types only; whether the kernel
    can run the combination is answered by ``validity_error()``.
    """

    # The family's name: the binding's and the generator's key for the class.
    family: ClassVar[str]
    # Whether a head size below d_head runs with masked tails (the binding's FamilyInfo says why).
    pads_head_with_masked_tails: ClassVar[bool]

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", coerce_dtype(self.dtype))
        for name, is_bool in _typed_fields(self):
            value = getattr(self, name)
            if is_bool:
                if not isinstance(value, bool):
                    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")

    def _order_key(self) -> tuple:
        return (self.family, *_field_values(type(self))(self))

    def __lt__(self, other):
        return self._order_key() < other._order_key() if isinstance(other, KernelConfig) else NotImplemented

    def __le__(self, other):
        return self._order_key() <= other._order_key() if isinstance(other, KernelConfig) else NotImplemented

    def __gt__(self, other):
        return self._order_key() > other._order_key() if isinstance(other, KernelConfig) else NotImplemented

    def __ge__(self, other):
        return self._order_key() >= other._order_key() if isinstance(other, KernelConfig) else NotImplemented

    def validity_error(self) -> str | None:
        """Why the kernel cannot run this configuration (the first failing rule), or None if it can."""
        raise NotImplementedError

    def is_valid(self) -> bool:
        return self.validity_error() is None

    def validate(self) -> None:
        """Raise ValueError with the reason if the kernel cannot run this configuration."""
        reason = self.validity_error()
        if reason is not None:
            raise ValueError(reason)

    def needs_masked_tails(self, seqlen_q: int, seqlen_k: int, d_head: int | None = None) -> bool:
        """Whether these lengths leave a partial last query block or key/value tile (every family's
        blocks are B_r query rows and its K/V tiles B_c keys), or, in a family that pads the head
        with masked tails, the call's ``d_head`` (default: the configuration's) is below the
        configuration's (the binding's ``Family::variant_for``)."""
        smaller_head = self.pads_head_with_masked_tails and d_head is not None and d_head < self.d_head
        return seqlen_q % self.B_r != 0 or seqlen_k % self.B_c != 0 or smaller_head

    def to_cpp_struct(self) -> str:
        """The C++ aggregate initializer with every field, as the generator writes it."""
        items = [_cpp_literal(value) for value in _field_values(type(self))(self)]
        return f"{type(self).__name__}{{{', '.join(items)}}}"

    def _demangled_initializer(self) -> str:
        """The configuration as a demangled kernel name spells its template argument: qualified, every
        field given, the dtype as a cast."""
        items = [
            f"(flash::DType){int(value)}" if isinstance(value, DType) else _cpp_literal(value)
            for value in _field_values(type(self))(self)
        ]
        return f"flash::{self.family}::{type(self).__name__}{{{', '.join(items)}}}"

    def _mangled_items(self) -> str:
        """The fields as the Itanium mangling spells the members of the template argument."""
        return "".join(
            f"LNS_5DTypeE{int(value)}E" if isinstance(value, DType)
            else f"Lb{int(value)}E" if isinstance(value, bool)
            else f"Li{value}E"
            for value in _field_values(type(self))(self)
        )  # fmt: skip


def demangled_variant(variant: ProblemVariant) -> str:
    """A problem variant as a demangled kernel name spells its four template arguments."""
    flags = ", ".join(_cpp_literal(flag) for flag in variant.flags())
    return f"(flash::MaskKind){int(variant.mask)}, {flags}"


def mangled_variant(variant: ProblemVariant) -> str:
    """A problem variant's four template arguments in the Itanium mangling."""
    return f"LNS_8MaskKindE{int(variant.mask)}E" + "".join(f"Lb{int(flag)}E" for flag in variant.flags())


# Each class's fields after dtype, each with whether it is a bool (else an int): what construction
# checks, read once per class (the tuning spaces construct hundreds of thousands). A plain dict, not
# functools.cache: torch.compile traces through a cache wrapper into dataclasses.fields(cls), which it
# cannot trace on a class, and a configuration may be built inside a compiled function.
_TYPED_FIELDS: dict[type, tuple[tuple[str, bool], ...]] = {}


def _typed_fields(config: KernelConfig) -> tuple[tuple[str, bool], ...]:
    """Field types are the annotation strings ("int", "bool"): annotations are postponed in the
    families' modules."""
    cls = type(config)
    typed = _TYPED_FIELDS.get(cls)
    if typed is None:
        typed = _TYPED_FIELDS[cls] = tuple(
            (field.name, field.type == "bool") for field in dataclasses.fields(config)[1:]
        )
    return typed


@functools.cache
def _field_values(cls: type) -> Callable[[KernelConfig], tuple]:
    """A function returning a configuration's field values in order (one C call: sorting large sets
    compares often)."""
    return operator.attrgetter(*(field.name for field in dataclasses.fields(cls)))


def _cpp_literal(value) -> str:
    if isinstance(value, DType):
        return value.to_cpp_str()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
