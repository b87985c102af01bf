"""Parsing a configuration's textual forms back into the configuration, for every kernel family: the
short forms people type, and any text holding a C++ initializer (demangled kernel names as Nsight
Compute and c++filt print them, the generator's initializers). Importable without torch.
"""

from __future__ import annotations

import dataclasses
import re
from typing import NamedTuple

from flash_helpers import sm80_config, sm90_config
from flash_helpers.dtypes import DType
from flash_helpers.families import FAMILIES
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = ["parse_kernel_name_into_config"]


class _ShortFormSyntax(NamedTuple):
    """How one family's short form reads: ``<prefix>(dtype, <int fields>)``, then optionally ``:``
    and flags joined by ``+``. A flag is a name that sets one bool field, or a numbered flag whose
    pattern's groups give int fields."""

    cls: type
    int_fields: tuple[str, ...]  # after the dtype, in order
    pattern: re.Pattern
    bool_flags: dict[str, str]
    # (pattern, the int fields its groups set, how the flag is spelled in messages)
    numbered_flags: tuple[tuple[re.Pattern, tuple[str, ...], str], ...] = ()

    def flag_settings(self, flag: str) -> dict | None:
        """The fields a flag sets, or None if it is not one of this family's flags."""
        if flag in self.bool_flags:
            return {self.bool_flags[flag]: True}
        for pattern, fields, _ in self.numbered_flags:
            numbers = pattern.fullmatch(flag)
            if numbers:
                return dict(zip(fields, map(int, numbers.groups())))
        return None

    def known_flags(self) -> str:
        return ", ".join([*self.bool_flags, *(spelling for _, _, spelling in self.numbered_flags)])


def _short_form(cls: type, prefix: str, int_fields: tuple[str, ...], bool_flags: dict[str, str], numbered_flags=()):
    numbers = "".join(rf"\s*,\s*(?P<{field}>\d+)" for field in int_fields)
    pattern = re.compile(rf"{prefix}\(\s*(?P<dtype>[\w.]+){numbers}\s*\)(?:\s*:\s*(?P<flags>.*))?")
    return _ShortFormSyntax(cls, int_fields, pattern, bool_flags, numbered_flags)


_SHORT_FORMS = (
    # The SM80 family's short form has no prefix: it was the only one before there were families.
    _short_form(
        FlashForwardKernelConfig,
        "",
        ("d_head", "B_r", "B_c", "n_warps"),
        {
            "async": "async_copy",
            "eager": "eager_load_blocks",
            "swizzled": "swizzled",
            "buffer": "mma_double_buffer_loads",
            "opt_softmax": "optimized_softmax",
        },
        (
            (
                re.compile(r"load_(\d+)_(\d+)_(\d+)_tiles"),
                ("Q_mma_load_K_tiles", "K_mma_load_K_tiles", "V_mma_load_K_tiles"),
                "load_<Q>_<K>_<V>_tiles",
            ),
        ),
    ),
    _short_form(
        HopperForwardKernelConfig,
        rf"{HopperForwardKernelConfig.family}\s*",
        ("d_head", "B_r", "B_c", "stages"),
        {"ws": "warp_specialized", "pingpong": "pingpong", "overlap": "intra_wg_overlap", "persistent": "persistent",
         "qregs": "Q_in_registers", "mcast": "multicast", "vtcopy": "V_transposed_copy",
         "odefer": "deferred_O_rescale"},
    ),
)

_CONFIG_CLASSES = {cls.__name__: cls for cls in FAMILIES.values()}
_STRUCT_RE = re.compile(rf"\b(?P<cls>{'|'.join(_CONFIG_CLASSES)})\s*\{{(?P<items>[^{{}}]*)\}}")
# One initializer item: an optional C-style cast such as (flash::DType) or (bool), then a value.
_ITEM_RE = re.compile(
    r"(?:\(\s*[\w:]+(?:\s+[\w:]+)*\s*\)\s*)?"  # optional cast
    r"(?:(?P<literal>true|false|\d+)|(?:\w+::)*DType::(?P<dtype>\w+))"
)


def parse_kernel_name_into_config(name: str) -> FlashForwardKernelConfig | HopperForwardKernelConfig:
    """Parse any textual form of a configuration, of any family, back into one.

    Accepts a short form (``(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles`` for the SM80 family,
    ``sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap`` for the Hopper family; flags in any order)
    or any text containing a ``FlashForwardKernelConfig{...}`` or ``HopperForwardKernelConfig{...}``
    initializer: demangled kernel names as c++filt and Nsight Compute print them (trailing zero
    fields omitted), ``to_cpp_struct()`` output, or plain numbers. The result is not validated.
    Raises ValueError quoting ``name`` otherwise.
    """
    if not isinstance(name, str):
        raise TypeError(f"kernel name must be a str, got {type(name).__name__}")
    struct = _STRUCT_RE.search(name)
    if struct:
        return _parse_struct_items(name, _CONFIG_CLASSES[struct["cls"]], struct["items"])
    for syntax in _SHORT_FORMS:
        short_form = syntax.pattern.fullmatch(name.strip())
        if short_form:
            return _parse_short_form(name, syntax, short_form)
    raise ValueError(
        f"cannot parse kernel name {name!r}: expected a short form such as '{sm80_config.SHORT_FORM_EXAMPLE}' "
        f"or '{sm90_config.SHORT_FORM_EXAMPLE}', or text containing "
        f"{' or '.join(repr(cls_name + '{...}') for cls_name in _CONFIG_CLASSES)}"
    )


def _parse_error(name: str, problem: str) -> ValueError:
    return ValueError(f"cannot parse kernel name {name!r}: {problem}")


def _build_config(name: str, cls: type, **fields):
    try:
        return cls(**fields)
    except ValueError as error:
        raise _parse_error(name, str(error)) from None


def _parse_short_form(name: str, syntax: _ShortFormSyntax, match: re.Match):
    # Field by field: torch.compile traces this, and cannot trace Match.groupdict.
    fields = {key: int(match[key]) for key in syntax.int_fields}
    fields["dtype"] = match["dtype"]
    flags = match["flags"]
    for flag in [] if flags is None else (part.strip() for part in flags.split("+")):
        settings = syntax.flag_settings(flag)
        if settings is None:
            raise _parse_error(name, f"unknown flag {flag!r}; flags are {syntax.known_flags()}, joined by '+'")
        if settings.keys() & fields.keys():
            raise _parse_error(name, f"flag {flag!r} repeats a setting made by an earlier flag")
        fields.update(settings)
    return _build_config(name, syntax.cls, **fields)


def _parse_struct_items(name: str, cls: type, items_text: str):
    all_fields = dataclasses.fields(cls)
    items = [item.strip() for item in items_text.split(",")] if items_text.strip() else []
    if len(items) > len(all_fields):
        raise _parse_error(name, f"{len(items)} initializer items, but the configuration has {len(all_fields)} fields")
    fields = {}
    for field, item in zip(all_fields, items):
        match = _ITEM_RE.fullmatch(item)
        value = _struct_item_value(field, match) if match else None
        if value is None:
            raise _parse_error(name, f"{item!r} is not a valid {field.name}")
        fields[field.name] = value
    # Trailing fields absent from a demangled name are zero: the mangling leaves them out.
    for field in all_fields[len(items) :]:
        fields[field.name] = False if field.type == "bool" else 0
    return _build_config(name, cls, **fields)


def _struct_item_value(field: dataclasses.Field, match: re.Match):
    """The value an initializer item gives ``field``, or None if it cannot be that field's."""
    literal, dtype_name = match["literal"], match["dtype"]
    if field.name == "dtype":
        if dtype_name is not None:
            return DType.__members__.get(dtype_name)
        return int(literal) if literal.isdigit() else None
    if dtype_name is not None:
        return None
    if field.type == "bool":
        return {"true": True, "false": False, "1": True, "0": False}.get(literal)
    return int(literal) if literal.isdigit() else None
