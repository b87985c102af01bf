"""Automatic configuration: which compiled configuration serves a problem, and why.

The choice is made in the extension (src/binding/dispatch.h), on every call that names no
configuration, from the dispatch table of the GPU's architecture (see flash_helpers.dispatch_table;
the tables ship in dispatch_tables/ and are handed to the extension once, on the first automatic
call). The entry measured at the problem's dtype, head size and mask, at the next measured length
up, speaks for the problem. Among the configurations ranked there that this build compiled with the
kernel variant the problem needs, it takes the one whose measured time, scaled to the problem's
lengths, is shortest: a configuration's time grows with the (query block, key tile) pairs it visits
(``flash_attention._C.visited_tiles`` counts them), and at lengths that are not multiples of its blocks
those counts differ between block sizes (1000 keys fill 7 tiles of 144 keys, 1008 in all, but 8
tiles of 128, 1024 in all). At the measured length itself that is the table's own order. Local
windows use the causal rankings: both skip tiles along the diagonal. A batch whose sequences have
lengths of their own (cu_seqlens, seqused, leftpad) needs a varlen kernel, and is read at its
longest sequences: max_seqlen_q and max_seqlen_k with cu_seqlens, the slots' lengths otherwise.

Where the table has no answer (no table for the architecture, no entry for the shape, or none of
the ranked configurations compiled with the variant), a rule chooses among the compiled
configurations of the problem's dtype and head size that have the variant: first the default build
set's configuration (the autotuned winner on the H200, and the one a plain install has), then the
largest tiles, which load K and V least often per FLOP.

``choose_config`` asks the extension for its choice without running the problem, and says why.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch
from flash_helpers.default_set import DEFAULT_BUILD_KERNELS
from flash_helpers.dispatch_table import DispatchTable, arch_name
from flash_helpers.dtypes import DType
from flash_helpers.families import FAMILIES
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import MaskKind, ProblemVariant
from flash_helpers.sm80_config import smem_limit

from . import _C
from .sequences import sequence_arguments

__all__ = [
    "ConfigChoice",
    "TABLES_DIR",
    "choose_config",
    "device_arch",
    "dispatch_table",
    "install_dispatch_tables",
    "load_dispatch_tables",
]

TABLES_DIR = Path(__file__).with_name("dispatch_tables")

# Why the rule chose where the table did not: the extension's RuleReason codes.
_RULE_REASONS = {
    1: "no dispatch table for {arch}",
    2: "the dispatch table for {arch} has no entry for {dtype}, d_head {d_head}",
    3: "the dispatch table for {arch} ranks no configuration this build compiled with this variant",
}
_DECODE_RULE = 4  # RuleReason::DECODE: a decode-shaped call, on the splitting configuration


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    """A chosen configuration, the kernel variant it runs the problem with, why it was chosen, and
    how many blocks share each query block's keys (num_splits; None where the multiprocessor count
    that decides it is unknown)."""

    config: object
    variant: ProblemVariant
    arch: str
    reason: str
    num_splits: int | None = 1

    def __str__(self) -> str:
        splits = {1: "", None: ", whether the keys split unknown (no multiprocessor count)"}.get(
            self.num_splits, f", keys split in {self.num_splits}"
        )
        return f"{self.config.short_form()} [{self.variant.describe()}{splits}] on {self.arch}: {self.reason}"


def device_arch(device: torch.device | str | int | None = None) -> str:
    """The architecture name (``sm_90``) of a CUDA device (default: the current one)."""
    return arch_name(torch.cuda.get_device_capability(device))


@functools.cache
def dispatch_table(arch: str) -> DispatchTable | None:
    """The shipped dispatch table of an architecture, or None where there is none."""
    path = TABLES_DIR / f"{arch}.json"
    return DispatchTable.load(path) if path.is_file() else None


def install_dispatch_tables(tables) -> None:
    """Hands these dispatch tables (one per architecture, replacing any handed before) and the
    default build set to the extension, whose calls that name no configuration choose from them."""
    config_of = functools.cache(parse_kernel_name_into_config)
    _installed.clear()
    converted = []
    for table in tables:
        _installed[table.arch] = table
        entries = [
            (int(DType[e.dtype]), e.d_head, e.causal, e.seq_len, [(config_of(c), t) for c, t in zip(e.ranked, e.times_ms, strict=True)])
            for e in table.entries
        ]
        converted.append((_capability_number(table.arch), entries))
    _C.load_dispatch_tables(converted, [config_of(text) for text in DEFAULT_BUILD_KERNELS])


@functools.cache
def load_dispatch_tables() -> None:
    """Installs the shipped dispatch tables, once (the first call that needs them)."""
    install_dispatch_tables(dispatch_table(path.stem) for path in sorted(TABLES_DIR.glob("sm_*.json")))


_installed: dict[str, DispatchTable] = {}  # the tables the extension holds, by architecture


def choose_config(
    q,
    k,
    *,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    cu_seqlens_q=None,
    cu_seqlens_k=None,
    max_seqlen_q=None,
    max_seqlen_k=None,
    seqused_q=None,
    seqused_k=None,
    leftpad_q=None,
    leftpad_k=None,
    kv_batch_idx=None,
    block_table=None,
    arch: str | None = None,
    multiprocessors: int | None = None,
) -> ConfigChoice:
    """The configuration that flash_attn_func, flash_attn_varlen_func and the operators use for this
    call when none is given.

    q and k are the call's tensors (or any tensors of the same shapes and dtype, e.g. on the meta
    device), in the (batch, seqlen, heads, d_head) layout, or (total, heads, d_head) with
    cu_seqlens; the keywords are the call's, checked as the call checks them (the per-sequence
    tensors may be on any device: only their shapes are read). A batch of sequences of different
    lengths runs a varlen kernel, chosen where the table ranks the longest sequences: at
    max_seqlen_q and max_seqlen_k with cu_seqlens, at the slots' lengths otherwise. arch names the
    GPU architecture (``sm_90``); by default, that of q's device.

    As the call does, up to 16 queries per sequence with grouped heads are chosen for with each
    query's heads of a group packed as rows,
    and a decode-shaped call (every sequence's queries fit one block of a splitting configuration)
    gets the one of fewest query rows per block that holds them where the split heuristic splits the
    keys or where it is a decoding configuration (64 rows per block or fewer), with num_splits the
    heuristic's count.
    The heuristic needs the GPU's multiprocessor count: ``multiprocessors``, by default q's
    device's; where q is not on a CUDA device and none is given, num_splits is None and the
    configuration is the one an unsplit call runs.
    """
    if arch is None:
        if not isinstance(q, torch.Tensor) or q.device.type != "cuda":
            where = f"a {q.device.type} tensor" if isinstance(q, torch.Tensor) else type(q).__name__
            raise ValueError(f"q: must be a CUDA tensor, or name the GPU with arch (e.g. arch='sm_90'); got {where}")
        arch = device_arch(q.device)
    sequences = sequence_arguments(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        leftpad_q=leftpad_q,
        leftpad_k=leftpad_k,
        kv_batch_idx=kv_batch_idx,
        block_table=block_table,
    )
    if multiprocessors is None:
        on_gpu = isinstance(q, torch.Tensor) and q.device.type == "cuda"
        multiprocessors = torch.cuda.get_device_properties(q.device).multi_processor_count if on_gpu else 0
    elif isinstance(multiprocessors, bool) or not isinstance(multiprocessors, int) or multiprocessors < 1:
        raise ValueError(f"multiprocessors: expected a positive int, got {multiprocessors!r}")
    load_dispatch_tables()
    gpu = (_capability_number(arch), smem_limit(_capability(arch)))
    (family, fields), variant, place, seq_len, ranked, rule, is_default, num_splits = _C.choose(
        q, k, causal, window_size, softcap, alibi_slopes, *gpu, **sequences, multiprocessors=multiprocessors
    )
    cfg = FAMILIES[family](*fields)
    variant = ProblemVariant(MaskKind(variant[0]), *variant[1:])
    dtype = cfg.dtype.name
    if place:
        table = _installed[arch]
        where = f"{dtype}, d_head {cfg.d_head}, {'causal' if variant.mask != MaskKind.NONE else 'no mask'}, seq {seq_len}"
        reason = (
            f"dispatch table {arch} ({table.gpu}, {table.date}) at {where}: place {place} of {ranked}; of what this "
            f"build compiled, the fastest at {_lengths_read(q, k, sequences)} by the table's times scaled by the "
            "tiles each configuration visits"
        )
    elif rule == _DECODE_RULE:
        count = (
            "the split unknown (no multiprocessor count)"
            if not num_splits
            else f"{num_splits} split{'s' if num_splits > 1 else ''} (the heuristic's count for {multiprocessors} multiprocessors)"
        )
        reason = (
            f"decoding (every sequence's queries fit one block): the compiled configuration with the fewest query "
            f"rows per block that holds them and splits the keys, for {dtype}, d_head {cfg.d_head}; {count}"
        )
    else:
        why = _RULE_REASONS[rule].format(arch=arch, dtype=dtype, d_head=cfg.d_head)
        kind = "the default set's configuration" if is_default else "the largest tiles compiled"
        reason = f"rule ({why}): {kind} for {dtype}, d_head {cfg.d_head}"
    return ConfigChoice(cfg, variant, arch, reason, num_splits or None)


def _lengths_read(q, k, sequences: dict) -> str:
    """The lengths at which the table was read, in words: the tensors' own; with cu_seqlens the
    longest sequences' (max_seqlen_q and max_seqlen_k); with seqused or leftpad alone, the slots'
    (the longest a sequence can be)."""
    if "cu_seqlens_q" in sequences:
        longest = f"max_seqlen_q {sequences['max_seqlen_q']}, max_seqlen_k {sequences['max_seqlen_k']}"
        return f"{longest} (the longest sequences, where the table was read)"
    lengths = f"seqlen_q {q.shape[1]}, seqlen_k {k.shape[1]}"
    return f"{lengths} (the slots' lengths, where the table was read)" if sequences else lengths


def _capability_number(arch: str) -> int:
    """The extension's number for an architecture: major * 10 + minor."""
    major, minor = _capability(arch)
    return major * 10 + minor


def _capability(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_") if isinstance(arch, str) else ""
    if not (isinstance(arch, str) and arch.startswith("sm_") and len(digits) >= 2 and digits.isdigit()):
        raise ValueError(f"arch: expected an architecture name such as 'sm_90', got {arch!r}")
    return int(digits[:-1]), int(digits[-1])
