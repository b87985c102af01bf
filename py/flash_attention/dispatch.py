"""Automatic configuration: which compiled configuration serves a problem, and why.

``choose_config`` looks the problem up in the dispatch table of its GPU's architecture (see
flash_helpers.dispatch_table; the tables ship in dispatch_tables/): the entry measured at the
problem's dtype, head size and mask, at the next measured length up. Among the configurations
ranked there that this build compiled with the kernel variant the problem needs, it takes the one
whose measured time, scaled to the problem's lengths, is shortest: a configuration's time grows
with the (query block, key tile) pairs it visits (``flash_helpers.problem.visited_tiles``), and at
lengths that are not multiples of its blocks those counts differ between block sizes (1000 keys
fill 7 tiles of 144 keys, 1008 in all, but 8 tiles of 128, 1024 in all). At the measured length
itself that is the table's own order. Local windows use the causal rankings: both skip tiles along
the diagonal.

Where the table has no answer (no table for the architecture, no entry for the shape, or none of
the ranked configurations compiled with the variant), a rule chooses among the compiled
configurations of the problem's dtype and head size that have the variant: first the default build
set's configuration (the autotuned winner on the H200, and the one a plain install has), then the
largest tiles, which load K and V least often per FLOP.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import torch
from flash_helpers.build_env import REBUILD_HINT
from flash_helpers.default_set import DEFAULT_BUILD_KERNELS
from flash_helpers.dispatch_table import DispatchTable, arch_name
from flash_helpers.dtypes import DType
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import MaskKind, ProblemVariant, mask_kind, needed_variant, visited_tiles

from .kernels import compiled_configs, compiled_kernels, compiled_kernel_set

__all__ = ["ConfigChoice", "TABLES_DIR", "choose_config", "dispatch_table", "device_arch"]

TABLES_DIR = Path(__file__).with_name("dispatch_tables")

_DTYPES = {torch.float16: DType.FP16, torch.bfloat16: DType.BF16}


@dataclasses.dataclass(frozen=True)
class ConfigChoice:
    """A chosen configuration, the kernel variant it runs the problem with, and why it was chosen."""

    config: object
    variant: ProblemVariant
    arch: str
    reason: str

    def __str__(self) -> str:
        return f"{self.config.short_form()} [{self.variant.describe()}] on {self.arch}: {self.reason}"


def device_arch(device: torch.device | str | int | None = None) -> str:
    """The architecture name (``sm_90``) of a CUDA device (default: the current one)."""
    return arch_name(torch.cuda.get_device_capability(device))


@functools.cache
def dispatch_table(arch: str) -> DispatchTable | None:
    """The shipped dispatch table of an architecture, or None where there is none."""
    path = TABLES_DIR / f"{arch}.json"
    return DispatchTable.load(path) if path.is_file() else None


def choose_config(
    q, k, *, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, arch: str | None = None
) -> ConfigChoice:
    """The configuration that flash_attn_func and the operators use for this call when none is given.

    q and k are the call's tensors (or any tensors of the same shapes and dtype, e.g. on the meta
    device), in the (batch, seqlen, heads, d_head) layout; the keywords are the call's. arch names
    the GPU architecture (``sm_90``); by default, that of q's device.
    """
    dtype = _dtype_of(q)
    if k.dim() != 4 or q.dim() != 4:
        raise ValueError(f"q, k: expected 4-dimensional (batch, seqlen, heads, d_head) tensors, got {q.dim()} and {k.dim()} dimensions")
    if arch is None:
        if q.device.type != "cuda":
            raise ValueError(f"q: must be a CUDA tensor (or pass arch), got a {q.device.type} tensor")
        arch = device_arch(q.device)
    score_mods = softcap != 0.0 or alibi_slopes is not None
    return _choose(dtype, q.shape[-1], q.shape[1], k.shape[1], causal, tuple(window_size), score_mods, arch)


def _dtype_of(q) -> DType:
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if q.dtype not in _DTYPES:
        raise TypeError(f"q: dtype must be float16 or bfloat16, got {q.dtype}")
    return _DTYPES[q.dtype]


@functools.lru_cache(maxsize=4096)
def _choose(dtype, d_head, seqlen_q, seqlen_k, causal, window_size, score_mods, arch) -> ConfigChoice:
    capability = _capability(arch)

    def variant_if_compiled(cfg) -> ProblemVariant | None:
        if not cfg.runs_on(capability):
            return None
        variant = needed_variant(cfg, seqlen_q, seqlen_k, causal, window_size, score_mods)
        return variant if variant in _variants_by_config().get(cfg, ()) else None

    table = dispatch_table(arch)
    masked = mask_kind(seqlen_q, seqlen_k, causal, window_size) != MaskKind.NONE
    entry = table.entry_for(dtype.name, d_head, masked, seqlen_q) if table else None
    if entry is not None:
        estimates = []  # (estimated time at this problem, place in the entry, configuration, variant)
        for place, (short_form, time_ms) in enumerate(zip(entry.ranked, entry.times_ms, strict=True), start=1):
            cfg = parse_kernel_name_into_config(short_form)
            variant = variant_if_compiled(cfg)
            if variant is not None:
                measured = visited_tiles(cfg.B_r, cfg.B_c, entry.seq_len, entry.seq_len, entry.causal)
                here = visited_tiles(cfg.B_r, cfg.B_c, seqlen_q, seqlen_k, causal, window_size)
                estimates.append((time_ms * here / measured, place, cfg, variant))
        if estimates:
            _, place, cfg, variant = min(estimates, key=lambda e: e[:2])
            where = f"{dtype.name}, d_head {d_head}, {'causal' if masked else 'no mask'}, seq {entry.seq_len}"
            reason = (
                f"dispatch table {arch} ({table.gpu}, {table.date}) at {where}: place {place} of "
                f"{len(entry.ranked)}; of what this build compiled, the fastest at seqlen_q {seqlen_q}, "
                f"seqlen_k {seqlen_k} by the table's times scaled by the tiles each configuration visits"
            )
            return ConfigChoice(cfg, variant, arch, reason)
        why_rule = f"the dispatch table for {arch} ranks no configuration this build compiled with this variant"
    elif table is None:
        why_rule = f"no dispatch table for {arch}"
    else:
        why_rule = f"the dispatch table for {arch} has no entry for {dtype.name}, d_head {d_head}"

    candidates = [cfg for cfg in compiled_configs() if cfg.dtype == dtype and cfg.d_head == d_head]
    defaults = _default_configs()
    candidates.sort(key=lambda cfg: (cfg not in defaults, -cfg.B_r * cfg.B_c, cfg))
    for cfg in candidates:
        variant = variant_if_compiled(cfg)
        if variant is not None:
            kind = "the default set's configuration" if cfg in defaults else "the largest tiles compiled"
            return ConfigChoice(cfg, variant, arch, f"rule ({why_rule}): {kind} for {dtype.name}, d_head {d_head}")
    raise ValueError(
        f"q: no configuration compiled into this build (kernel set '{compiled_kernel_set()}') runs {dtype.name} "
        f"attention with d_head {d_head} on {arch} (seqlen_q {seqlen_q}, seqlen_k {seqlen_k}, causal {causal}, "
        f"window_size {window_size}, softcap/ALiBi {score_mods}); {REBUILD_HINT}"
    )


def _capability(arch: str) -> tuple[int, int]:
    digits = arch.removeprefix("sm_")
    if not (arch.startswith("sm_") and len(digits) >= 2 and digits.isdigit()):
        raise ValueError(f"arch: expected an architecture name such as 'sm_90', got {arch!r}")
    return int(digits[:-1]), int(digits[-1])


@functools.cache
def _variants_by_config() -> dict:
    variants: dict = {}
    for cfg, variant in compiled_kernels():
        variants.setdefault(cfg, set()).add(variant)
    return variants


@functools.cache
def _default_configs() -> frozenset:
    return frozenset(parse_kernel_name_into_config(text) for text in DEFAULT_BUILD_KERNELS)
