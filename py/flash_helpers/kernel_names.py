"""Parsing a configuration's textual forms back into the configuration: the short form people type,
and any text holding the C++ initializer (demangled kernel names as Nsight Compute and c++filt
print them, the generator's initializers). Importable without torch.
"""

from __future__ import annotations

import dataclasses
import re

from flash_helpers.dtypes import DType
from flash_helpers.sm80_config import SHORT_FORM_EXAMPLE, FlashForwardKernelConfig

__all__ = ["parse_kernel_name_into_config"]

_FIELDS = dataclasses.fields(FlashForwardKernelConfig)

_SHORT_FORM_RE = re.compile(
    r"\(\s*(?P<dtype>[\w.]+)\s*,\s*(?P<d_head>\d+)\s*,\s*(?P<B_r>\d+)\s*,\s*(?P<B_c>\d+)\s*,\s*(?P<n_warps>\d+)\s*\)"
    r"(?:\s*:\s*(?P<flags>.*))?"
)
_SHORT_FORM_BOOL_FLAGS = {
    "async": "async_copy",
    "eager": "eager_load_blocks",
    "swizzled": "swizzled",
    "buffer": "mma_double_buffer_loads",
    "opt_softmax": "optimized_softmax",
}
_LOAD_TILES_FLAG_RE = re.compile(r"load_(\d+)_(\d+)_(\d+)_tiles")
_LOAD_TILES_FIELDS = ("Q_mma_load_K_tiles", "K_mma_load_K_tiles", "V_mma_load_K_tiles")

_STRUCT_RE = re.compile(r"FlashForwardKernelConfig\s*\{(?P<items>[^{}]*)\}")
# One initializer item: an optional C-style cast such as (flash::DType) or (bool), then a value.
_ITEM_RE = re.compile(
    r"(?:\(\s*[\w:]+(?:\s+[\w:]+)*\s*\)\s*)?"  # optional cast
    r"(?:(?P<literal>true|false|\d+)|(?:\w+::)*DType::(?P<dtype>\w+))"
)


def parse_kernel_name_into_config(name: str) -> FlashForwardKernelConfig:
    """Parse any textual form of a configuration back into one.

    Accepts a short form (``(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles``, flags in any order)
    or any text containing a ``FlashForwardKernelConfig{...}`` initializer: demangled kernel names as
    c++filt and Nsight Compute print them (trailing zero fields omitted), ``to_cpp_struct()`` output,
    or plain numbers. The result is not validated. Raises ValueError quoting ``name`` otherwise.
    """
    if not isinstance(name, str):
        raise TypeError(f"kernel name must be a str, got {type(name).__name__}")
    struct = _STRUCT_RE.search(name)
    if struct:
        return _parse_struct_items(name, struct["items"])
    short_form = _SHORT_FORM_RE.fullmatch(name.strip())
    if short_form:
        return _parse_short_form(name, short_form)
    raise ValueError(
        f"cannot parse kernel name {name!r}: expected a short form such as '{SHORT_FORM_EXAMPLE}' "
        "or text containing 'FlashForwardKernelConfig{...}'"
    )


def _parse_error(name: str, problem: str) -> ValueError:
    return ValueError(f"cannot parse kernel name {name!r}: {problem}")


def _build_config(name: str, **fields) -> FlashForwardKernelConfig:
    try:
        return FlashForwardKernelConfig(**fields)
    except ValueError as error:
        raise _parse_error(name, str(error)) from None


def _parse_short_form(name: str, match: re.Match) -> FlashForwardKernelConfig:
    fields = {key: int(match[key]) for key in ("d_head", "B_r", "B_c", "n_warps")}
    fields["dtype"] = match["dtype"]
    flags = match["flags"]
    for flag in [] if flags is None else (part.strip() for part in flags.split("+")):
        tiles = _LOAD_TILES_FLAG_RE.fullmatch(flag)
        if flag in _SHORT_FORM_BOOL_FLAGS:
            settings = {_SHORT_FORM_BOOL_FLAGS[flag]: True}
        elif tiles:
            settings = dict(zip(_LOAD_TILES_FIELDS, map(int, tiles.groups())))
        else:
            known = ", ".join([*_SHORT_FORM_BOOL_FLAGS, "load_<Q>_<K>_<V>_tiles"])
            raise _parse_error(name, f"unknown flag {flag!r}; flags are {known}, joined by '+'")
        if settings.keys() & fields.keys():
            raise _parse_error(name, f"flag {flag!r} repeats a setting made by an earlier flag")
        fields.update(settings)
    return _build_config(name, **fields)


def _parse_struct_items(name: str, items_text: str) -> FlashForwardKernelConfig:
    items = [item.strip() for item in items_text.split(",")] if items_text.strip() else []
    if len(items) > len(_FIELDS):
        raise _parse_error(name, f"{len(items)} initializer items, but the configuration has {len(_FIELDS)} fields")
    fields = {}
    for field, item in zip(_FIELDS, items):
        match = _ITEM_RE.fullmatch(item)
        value = _struct_item_value(field, match) if match else None
        if value is None:
            raise _parse_error(name, f"{item!r} is not a valid {field.name}")
        fields[field.name] = value
    # Trailing fields absent from a demangled name are zero: the mangling leaves them out.
    for field in _FIELDS[len(items) :]:
        fields[field.name] = False if field.type == "bool" else 0
    return _build_config(name, **fields)


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
