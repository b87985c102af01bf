"""Forward-kernel configurations: the Python mirror of the C++ ``FlashForwardKernelConfig``.

A configuration names one compiled instantiation of the forward kernel. This module defines
the configuration type, its textual forms (the short form people read and type, the C++
initializer the generator writes, the demangled name profilers print) and the parser that
maps any of them back, the rules that say which combinations the kernel can run, and the
named sets of configurations that the build, the tests and the benchmarks iterate over.

It deliberately has no torch dependency at import time so the build (which runs before the
extension exists) and machines without torch can use it; only ``DType.to_torch_dtype`` and
``DType.from_torch_dtype`` import torch, lazily.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import itertools
import os
import re
from collections.abc import Callable, Iterable

__all__ = [
    "B_CS",
    "B_RS",
    "BUILD_KERNELS_ENV",
    "D_HEADS",
    "DEFAULT_BUILD_KERNELS",
    "DTYPES",
    "DType",
    "FlashForwardKernelConfig",
    "KERNELS_ENV",
    "LOAD_TILES",
    "N_WARPS",
    "PROGRESSION_BLOCK_SIZE",
    "PROGRESSION_STEPS",
    "get_all_kernel_configs",
    "get_autotuning_kernel_configs",
    "get_kernel_configs",
    "get_kernel_progression_configs",
    "get_kernels_to_build",
    "parse_kernel_name_into_config",
    "resolve_build_kernels_key",
    "should_autotune_config",
]


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

# The values each dimension of the configuration space can take. The first four are also what the
# kernel supports (validity rule 1); the load-tile counts and booleans are further constrained by
# the other rules.
DTYPES = (DType.FP16, DType.BF16)
D_HEADS = (64, 128)
B_RS = (64, 128)
B_CS = (32, 64, 128)
N_WARPS = (4, 8)
LOAD_TILES = (0, 1, 2, 4)
_BOOLS = (False, True)


# The k-dimension of one mma.sync.m16n8k16 instruction: GEMMs are split into slices this deep.
_MMA_K = 16
# The M of one mma.sync.m16n8k16 instruction: the granularity of a warp's query rows.
_MMA_M = 16

_SHORT_FORM_EXAMPLE = "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles"


@dataclasses.dataclass(frozen=True, order=True)
class FlashForwardKernelConfig:
    """One forward-kernel configuration.

    Field order is the C++ struct's order and defines the ordering (dtype by its code, False < True),
    so sorting here and iterating the C++ ``std::map`` agree. Construction checks types only; whether
    the kernel can run the combination is answered by ``validity_error()``.
    """

    dtype: DType
    d_head: int
    B_r: int
    B_c: int
    n_warps: int
    async_copy: bool = False
    eager_load_blocks: bool = False
    swizzled: bool = False
    Q_mma_load_K_tiles: int = 0
    K_mma_load_K_tiles: int = 0
    V_mma_load_K_tiles: int = 0
    mma_double_buffer_loads: bool = False
    optimized_softmax: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", _coerce_dtype(self.dtype))
        # Field types are the annotation strings ("int", "bool"): annotations are postponed here.
        for field in dataclasses.fields(self)[1:]:
            value = getattr(self, field.name)
            if field.type == "bool":
                if not isinstance(value, bool):
                    raise TypeError(f"{field.name} must be a bool, got {type(value).__name__} {value!r}")
            elif isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{field.name} must be an int, got {type(value).__name__} {value!r}")

    def _flags(self) -> list[str]:
        """The short form's flags, in their fixed order."""
        tiles = (self.Q_mma_load_K_tiles, self.K_mma_load_K_tiles, self.V_mma_load_K_tiles)
        candidates = (
            ("async", self.async_copy),
            ("eager", self.eager_load_blocks),
            ("swizzled", self.swizzled),
            ("load_{}_{}_{}_tiles".format(*tiles), any(tiles)),
            ("buffer", self.mma_double_buffer_loads),
            ("opt_softmax", self.optimized_softmax),
        )
        return [flag for flag, present in candidates if present]

    def short_form(self) -> str:
        """The human-readable form, e.g. ``(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles``."""
        head = f"({self.dtype.name}, {self.d_head}, {self.B_r}, {self.B_c}, {self.n_warps})"
        flags = self._flags()
        return f"{head}: {'+'.join(flags)}" if flags else head

    def to_cpp_struct(self) -> str:
        """The C++ aggregate initializer with all 13 fields, as the generator writes it."""
        items = [_cpp_literal(value) for value in dataclasses.astuple(self)]
        return f"FlashForwardKernelConfig{{{', '.join(items)}}}"

    def kernel_name(self) -> str:
        """The C++ template-id of this configuration's kernel (inside ``namespace flash``)."""
        return f"flash_forward_kernel<StaticForwardKernelConfig<{self.to_cpp_struct()}>>"

    def demangled_kernel_name(self) -> str:
        """The kernel's name as Nsight Compute prints it: the demangled device symbol.

        The device symbol spells all 13 fields, the dtype as a cast. (The host-side stub's symbol
        leaves out trailing zero-valued fields; the parser accepts that form too.)
        """
        items = [
            f"(flash::DType){int(value)}" if isinstance(value, DType) else _cpp_literal(value)
            for value in dataclasses.astuple(self)
        ]
        return (
            "void flash::flash_forward_kernel<flash::StaticForwardKernelConfig<"
            f"flash::FlashForwardKernelConfig{{{', '.join(items)}}}> >(flash::ForwardKernelArgs)"
        )

    def mangled_kernel_name(self) -> str:
        """The kernel's device symbol (Itanium mangling), as ``cuobjdump`` lists it in the SASS."""
        items = "".join(
            f"LNS_5DTypeE{int(value)}E" if isinstance(value, DType)
            else f"Lb{int(value)}E" if isinstance(value, bool)
            else f"Li{value}E"
            for value in dataclasses.astuple(self)
        )
        return (
            "_ZN5flash20flash_forward_kernelINS_25StaticForwardKernelConfigIXtlNS_24FlashForwardKernelConfigE"
            f"{items}EEEEEEvNS_17ForwardKernelArgsE"
        )

    def file_stem(self) -> str:
        """A unique, filesystem-safe name, e.g. ``fp16_d128_br64_bc64_w4_async_load_0_2_2``.

        The flags are the short form's (their fixed set and order keep the name unique); the tile
        flag's ``_tiles`` suffix adds nothing in a file name and is dropped.
        """
        parts = [self.dtype.name.lower(), f"d{self.d_head}", f"br{self.B_r}", f"bc{self.B_c}", f"w{self.n_warps}"]
        parts += [flag.removesuffix("_tiles") for flag in self._flags()]
        return "_".join(parts)

    def smem_bytes(self) -> int:
        """Dynamic shared memory of one block, 2-byte elements: the Q tile, and a K and a V tile per
        pipeline stage (two with eager_load_blocks, which copies the next tiles into the second)."""
        stages = 2 if self.eager_load_blocks else 1
        return (self.B_r + 2 * self.B_c * stages) * self.d_head * 2

    def attn_flop(self, batch: int, heads: int, seq_len: int) -> int:
        """FLOPs of the two matmuls (Q K^T and P V): the count every attention TFLOP/s figure uses."""
        return 4 * batch * heads * seq_len**2 * self.d_head

    def total_flop(self, batch: int, heads: int, seq_len: int) -> int:
        """All floating-point work: the two matmuls (``attn_flop``), plus the online softmax's five
        elementwise operations per score (scale, max, subtract, exp, sum), plus normalising each
        output element by its row sum once at the end."""
        softmax = 5 * batch * heads * seq_len**2
        normalisation = batch * heads * seq_len * self.d_head
        return self.attn_flop(batch, heads, seq_len) + softmax + normalisation

    def validity_error(self) -> str | None:
        """Why the kernel cannot run this configuration (the first failing rule), or None if it can."""
        for field, supported in (("d_head", D_HEADS), ("B_r", B_RS), ("B_c", B_CS), ("n_warps", N_WARPS)):
            value = getattr(self, field)
            if value not in supported:
                return f"{field} must be one of {', '.join(map(str, supported))}; got {value}."

        rows_multiple = _MMA_M * self.n_warps
        if self.B_r % rows_multiple:
            return (
                f"B_r ({self.B_r}) must be a multiple of 16 * n_warps = {rows_multiple}: each of the "
                f"{self.n_warps} warps owns B_r / n_warps query rows, which must be a multiple of 16, the MMA's M."
            )

        if self.eager_load_blocks and not self.async_copy:
            return "eager_load_blocks requires async_copy: only cp.async copies can be in flight during compute."

        for field, extent, gemm in (
            ("Q_mma_load_K_tiles", "d_head", "Q K^T"),
            ("K_mma_load_K_tiles", "d_head", "Q K^T"),
            ("V_mma_load_K_tiles", "B_c", "P V"),
        ):
            tiles = getattr(self, field)
            slices = getattr(self, extent) // _MMA_K
            if tiles != 0 and not (tiles > 0 and tiles & (tiles - 1) == 0 and tiles < slices):
                return (
                    f"{field} must be 0 (the whole operand at once) or a power of two (1, 2, 4, ...) below "
                    f"the {slices} k-slices of the {gemm} GEMM ({extent} / 16); got {tiles}."
                )

        if self.Q_mma_load_K_tiles not in (0, self.K_mma_load_K_tiles):
            return (
                f"Q_mma_load_K_tiles must be 0 (Q fragments loaded once and kept in registers) or equal to "
                f"K_mma_load_K_tiles = {self.K_mma_load_K_tiles} (Q and K slices loaded together); "
                f"got {self.Q_mma_load_K_tiles}."
            )

        if self.mma_double_buffer_loads and not (self.K_mma_load_K_tiles or self.V_mma_load_K_tiles):
            return (
                "mma_double_buffer_loads needs K or V loaded in chunks (a nonzero K_mma_load_K_tiles or "
                "V_mma_load_K_tiles): with whole operands there is no next chunk to load early."
            )
        return None

    def is_valid(self) -> bool:
        return self.validity_error() is None

    def validate(self) -> None:
        """Raise ValueError with the reason if the kernel cannot run this configuration."""
        reason = self.validity_error()
        if reason is not None:
            raise ValueError(reason)


_FIELDS = dataclasses.fields(FlashForwardKernelConfig)


def _coerce_dtype(value) -> DType:
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


def _cpp_literal(value) -> str:
    if isinstance(value, DType):
        return value.to_cpp_str()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ----------------------------------------------------------------------------------------------
# Parsing

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
        f"cannot parse kernel name {name!r}: expected a short form such as '{_SHORT_FORM_EXAMPLE}' "
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


# ----------------------------------------------------------------------------------------------
# Configuration sets


def _sorted_unique(configs: Iterable[FlashForwardKernelConfig]) -> list[FlashForwardKernelConfig]:
    return sorted(set(configs))


@functools.cache
def _valid_configs(dtypes: tuple[DType, ...], d_heads: tuple[int, ...]) -> tuple[FlashForwardKernelConfig, ...]:
    """Every valid configuration with these dtypes and head sizes (the product is large: cached)."""
    product = itertools.product(
        dtypes, d_heads, B_RS, B_CS, N_WARPS, _BOOLS, _BOOLS, _BOOLS, LOAD_TILES, LOAD_TILES, LOAD_TILES, _BOOLS, _BOOLS
    )
    return tuple(_sorted_unique(cfg for cfg in itertools.starmap(FlashForwardKernelConfig, product) if cfg.is_valid()))


def get_all_kernel_configs() -> list[FlashForwardKernelConfig]:
    """Every valid configuration over the whole configuration space."""
    return list(_valid_configs(DTYPES, D_HEADS))


def should_autotune_config(cfg: FlashForwardKernelConfig) -> bool:
    """Whether an autotuning sweep should try ``cfg``, on top of it being valid.

    The sweep varies what trades off against the register budget and the block shape: B_r, B_c,
    n_warps, whether Q stays in registers, and the K and V chunk sizes. The knobs that only remove
    work are always on (the progression measures each of them on its own): async copies, eager
    K/V loads, the swizzled layout, double-buffered fragment loads and the optimized softmax.
    K and V are always loaded in chunks of 1 or 2 k-slices: whole operands need more registers
    than a thread has for any block shape worth tuning.
    """
    return (
        cfg.is_valid()
        and cfg.async_copy
        and cfg.eager_load_blocks
        and cfg.swizzled
        and cfg.mma_double_buffer_loads
        and cfg.optimized_softmax
        and cfg.K_mma_load_K_tiles in (1, 2)
        and cfg.V_mma_load_K_tiles in (1, 2)
    )


def get_autotuning_kernel_configs(
    dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = D_HEADS
) -> list[FlashForwardKernelConfig]:
    """The autotuning space: valid configurations that pass ``should_autotune_config``."""
    configs = _valid_configs(tuple(_coerce_dtype(dtype) for dtype in dtypes), tuple(d_heads))
    return [cfg for cfg in configs if should_autotune_config(cfg)]


# The kernel's optimisation history: each step adds knobs to the previous one, in the order they
# were introduced. A step that is invalid at some block size is skipped there.
PROGRESSION_STEPS = [
    ("base", ""),
    ("async", "async"),
    ("swizzled", "async+swizzled"),
    ("eager", "async+eager+swizzled"),
    ("load_tiles", "async+eager+swizzled+load_1_1_1_tiles"),
    ("buffer", "async+eager+swizzled+load_1_1_1_tiles+buffer"),
    ("opt_softmax", "async+eager+swizzled+load_1_1_1_tiles+buffer+opt_softmax"),
]
# (B_r, B_c, n_warps) at which the progression is compared by default.
PROGRESSION_BLOCK_SIZE = (128, 64, 4)


def get_kernel_progression_configs(
    all_block_sizes: bool = False, dtypes: Iterable[DType] = DTYPES, d_heads: Iterable[int] = (128,)
) -> list[FlashForwardKernelConfig]:
    """The valid progression steps at ``PROGRESSION_BLOCK_SIZE``, or at every block size."""
    block_sizes = itertools.product(B_RS, B_CS, N_WARPS) if all_block_sizes else [PROGRESSION_BLOCK_SIZE]
    configs = []
    for dtype, d_head, (B_r, B_c, n_warps), (_, flags) in itertools.product(
        dtypes, d_heads, block_sizes, PROGRESSION_STEPS
    ):
        head = f"({_coerce_dtype(dtype).name}, {d_head}, {B_r}, {B_c}, {n_warps})"
        configs.append(parse_kernel_name_into_config(f"{head}: {flags}" if flags else head))
    return _sorted_unique(cfg for cfg in configs if cfg.is_valid())


KERNELS_ENV = "KERNELS"
_NAMED_KERNEL_SETS: dict[str, Callable[[], list[FlashForwardKernelConfig]]] = {
    "all": get_all_kernel_configs,
    "prog": get_kernel_progression_configs,
    "progall": functools.partial(get_kernel_progression_configs, all_block_sizes=True),
    "tune": get_autotuning_kernel_configs,
}
_BLOCK_SIZES_KEY_RE = re.compile(r"(\d+)\s*,\s*(\d+)")


def get_kernel_configs(key: str | None = None) -> list[FlashForwardKernelConfig]:
    """The configurations a tool or test run should use, selected by ``key``.

    ``key`` defaults to the ``KERNELS`` environment variable, then to ``all``. It is a set name
    (``all``, ``prog``, ``progall``, ``tune``), ``B_r,B_c`` (the tuning set at those block sizes),
    or short forms separated by ``;`` (each must be a valid configuration).
    """
    if key is None:
        key = os.environ.get(KERNELS_ENV) or "all"
    return _select_configs(key, _NAMED_KERNEL_SETS)


def _select_configs(
    key: str, named_sets: dict[str, Callable[[], list[FlashForwardKernelConfig]]]
) -> list[FlashForwardKernelConfig]:
    key = key.strip()
    if "+" in key and "(" not in key and "{" not in key:
        # A union of sets, e.g. "tune+prog" (short forms contain "+" too, but also "(").
        return _sorted_unique(cfg for part in key.split("+") for cfg in _select_configs(part, named_sets))
    if key.lower() in named_sets:
        return named_sets[key.lower()]()
    block_sizes = _BLOCK_SIZES_KEY_RE.fullmatch(key)
    if block_sizes:
        B_r, B_c = map(int, block_sizes.groups())
        configs = [cfg for cfg in get_autotuning_kernel_configs() if (cfg.B_r, cfg.B_c) == (B_r, B_c)]
        if not configs:
            raise ValueError(f"kernel set {key!r}: no tuning configuration has B_r = {B_r} and B_c = {B_c}")
        return configs
    if "(" in key or "{" in key:
        return _sorted_unique(_parse_valid_config(part) for part in key.split(";") if part.strip())
    raise ValueError(
        f"unknown kernel set {key!r}; valid keys are {', '.join(repr(name) for name in named_sets)}, "
        f"'B_r,B_c' (e.g. '128,64'), short forms separated by ';' (e.g. '{_SHORT_FORM_EXAMPLE}'), "
        "or a union of those joined by '+' (e.g. 'tune+prog')"
    )


def _parse_valid_config(text: str) -> FlashForwardKernelConfig:
    cfg = parse_kernel_name_into_config(text)
    reason = cfg.validity_error()
    if reason is not None:
        raise ValueError(f"{text.strip()!r} is not a valid configuration: {reason}")
    return cfg


# The small set compiled by default, so a build takes minutes: per dtype and d_head, the tuning
# set's configuration with the best harmonic mean of TFLOP/s over the autotuned sequence lengths
# on the H200 (BENCHMARKS.md).
DEFAULT_BUILD_KERNELS = (
    "(FP16, 64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "(FP16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
    "(BF16, 64, 128, 64, 4): async+eager+swizzled+load_0_1_1_tiles+buffer+opt_softmax",
    "(BF16, 128, 128, 64, 4): async+eager+swizzled+load_1_1_2_tiles+buffer+opt_softmax",
)
BUILD_KERNELS_ENV = "FLASH_BUILD_KERNELS"
_BUILD_KERNEL_SETS = {
    "default": functools.partial(get_kernel_configs, ";".join(DEFAULT_BUILD_KERNELS)),
    **_NAMED_KERNEL_SETS,
}


def resolve_build_kernels_key(key: str | None = None) -> str:
    """The build's kernel-set key: ``key``, else ``FLASH_BUILD_KERNELS``, else ``default``."""
    return key if key is not None else os.environ.get(BUILD_KERNELS_ENV) or "default"


def get_kernels_to_build(key: str | None = None) -> list[FlashForwardKernelConfig]:
    """The configurations to compile: ``default`` is ``DEFAULT_BUILD_KERNELS``; any other key is a
    ``get_kernel_configs`` key (``tune``, ``prog``, ``all``, short forms, ...)."""
    return _select_configs(resolve_build_kernels_key(key), _BUILD_KERNEL_SETS)

