"""Named sets of configurations, spanning the kernel families, and the selection of sets by key:
what the tests and tools run (``KERNELS``) and what the build compiles (``FLASH_BUILD_KERNELS``, for
the architectures of ``TORCH_CUDA_ARCH_LIST``), with the problem variants compiled for each
configuration. Importable without torch.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable

from flash_helpers import sm80_config, sm90_config
from flash_helpers.build_env import ARCH_LIST_ENV, resolve_arch_list, resolve_build_kernels_key, sm90_in_arch_list
from flash_helpers.default_set import DECODE_KERNELS, DEFAULT_BUILD_KERNELS, VARLEN_KERNELS
from flash_helpers.kernel_config import KernelConfig
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.problem import (
    ALL_VARIANTS,
    BENCHMARK_LENGTH_UNIT,
    BENCHMARK_TAIL_VARIANTS,
    BENCHMARK_VARIANTS,
    KV_E4M3_VARIANTS,
    VARLEN_VARIANTS,
    ProblemVariant,
)
from flash_helpers.progression_steps import get_kernel_progression_configs
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig
from flash_helpers.tuning_space import get_all_kernel_configs, get_autotuning_kernel_configs

__all__ = ["KERNELS_ENV", "get_kernel_configs", "get_kernels_to_build", "variants_to_build"]

KERNELS_ENV = "KERNELS"
_NAMED_KERNEL_SETS: dict[str, Callable[[], list[KernelConfig]]] = {
    # What a plain install compiles.
    "default": lambda: get_kernel_configs(";".join(DEFAULT_BUILD_KERNELS + DECODE_KERNELS)),
    "all": get_all_kernel_configs,
    "prog": get_kernel_progression_configs,
    "progall": functools.partial(get_kernel_progression_configs, all_block_sizes=True),
    "tune": get_autotuning_kernel_configs,
}
_BLOCK_SIZES_KEY_RE = re.compile(r"(\d+)\s*,\s*(\d+)")


def get_kernel_configs(key: str | None = None) -> list[KernelConfig]:
    """The configurations a tool or test run should use, selected by ``key``.

    ``key`` defaults to the ``KERNELS`` environment variable, then to ``all``. It is a set name
    (``default``, ``all``, ``prog``, ``progall``, ``tune``; each holds every family's configurations), ``B_r,B_c``
    (the SM80 family's tuning set at those block sizes), or short forms of any family separated by
    ``;`` (each must be a valid configuration).
    """
    if key is None:
        key = os.environ.get(KERNELS_ENV) or "all"
    return _select_configs(key, _NAMED_KERNEL_SETS)


def _select_configs(
    key: str, named_sets: dict[str, Callable[[], list[KernelConfig]]], arch_list: str | None = None
) -> list[KernelConfig]:
    """The configurations ``key`` selects; for a build for ``arch_list`` (None: no build), without
    Hopper configurations unless the list has sm_90: sets leave them out, and naming one is an error."""
    key = key.strip()
    with_sm90 = arch_list is None or sm90_in_arch_list(arch_list)
    if "+" in key and "(" not in key and "{" not in key:
        # A union of sets, e.g. "tune+prog" (short forms contain "+" too, but also "(").
        return sorted({cfg for part in key.split("+") for cfg in _select_configs(part, named_sets, arch_list)})
    if key.lower() in named_sets:
        configs = named_sets[key.lower()]()
        return configs if with_sm90 else [cfg for cfg in configs if not isinstance(cfg, HopperForwardKernelConfig)]
    block_sizes = _BLOCK_SIZES_KEY_RE.fullmatch(key)
    if block_sizes:
        B_r, B_c = map(int, block_sizes.groups())
        configs = [
            cfg
            for cfg in get_autotuning_kernel_configs()
            if isinstance(cfg, FlashForwardKernelConfig) and (cfg.B_r, cfg.B_c) == (B_r, B_c)
        ]
        if not configs:
            raise ValueError(f"kernel set {key!r}: no SM80 tuning configuration has B_r = {B_r} and B_c = {B_c}")
        return configs
    if "(" in key or "{" in key:
        configs = sorted({_parse_valid_config(part) for part in key.split(";") if part.strip()})
        sm90_forms = [cfg.short_form() for cfg in configs if isinstance(cfg, HopperForwardKernelConfig)]
        if sm90_forms and not with_sm90:
            raise ValueError(
                f"kernel set {key!r} names {len(sm90_forms)} Hopper configuration(s) ({'; '.join(sm90_forms)}), "
                f"which need sm_90a machine code, but {ARCH_LIST_ENV}={arch_list!r} has no 9.0: add 9.0 to "
                f"{ARCH_LIST_ENV}"
            )
        return configs
    raise ValueError(
        f"unknown kernel set {key!r}; valid keys are {', '.join(repr(name) for name in named_sets)}, "
        f"'B_r,B_c' (e.g. '128,64'), short forms separated by ';' (e.g. '{sm80_config.SHORT_FORM_EXAMPLE}' or "
        f"'{sm90_config.SHORT_FORM_EXAMPLE}'), or a union of those joined by '+' (e.g. 'tune+prog')"
    )


def _parse_valid_config(text: str) -> KernelConfig:
    cfg = parse_kernel_name_into_config(text)
    reason = cfg.validity_error()
    if reason is not None:
        raise ValueError(f"{text.strip()!r} is not a valid configuration: {reason}")
    return cfg


def variants_to_build(cfg: KernelConfig) -> tuple[ProblemVariant, ...]:
    """The problem variants compiled for ``cfg``: every dense variant for the default set's
    configurations (what a plain install serves), and the varlen variants for those of
    VARLEN_KERNELS, and those alone, with their FP8-cache versions, for DECODE_KERNELS; the
    benchmark shapes' for the others (what
    tuning and the progression measure),
    so large sets stay quick to build; with their masked-tail versions where the configuration's
    blocks do not divide the benchmark lengths (B_r 192, B_c 176, ...)."""
    if cfg in _decode_configs():
        return VARLEN_VARIANTS + KV_E4M3_VARIANTS
    if cfg in _varlen_configs():
        return ALL_VARIANTS + VARLEN_VARIANTS
    if cfg in _default_configs():
        return ALL_VARIANTS
    if cfg.needs_masked_tails(BENCHMARK_LENGTH_UNIT, BENCHMARK_LENGTH_UNIT):
        return BENCHMARK_VARIANTS + BENCHMARK_TAIL_VARIANTS
    return BENCHMARK_VARIANTS


@functools.cache
def _default_configs() -> frozenset[KernelConfig]:
    """The default set of every family, whatever the architectures."""
    return frozenset(_NAMED_KERNEL_SETS["default"]())


@functools.cache
def _decode_configs() -> frozenset[KernelConfig]:
    return frozenset(map(parse_kernel_name_into_config, DECODE_KERNELS))


@functools.cache
def _varlen_configs() -> frozenset[KernelConfig]:
    return frozenset(map(parse_kernel_name_into_config, VARLEN_KERNELS))


def get_kernels_to_build(key: str | None = None, arch_list: str | None = None) -> list[KernelConfig]:
    """The configurations to compile for ``arch_list`` (``resolve_arch_list``): ``default`` is
    ``DEFAULT_BUILD_KERNELS`` and ``DECODE_KERNELS``; any other key is a ``get_kernel_configs`` key (``tune``, ``prog``,
    ``all``, short forms, ...).

    Hopper configurations are compiled only for a list with 9.0: without it the sets leave them out,
    so a build for sm_80 alone keeps working, and short forms naming one raise ValueError.
    """
    return _select_configs(resolve_build_kernels_key(key), _NAMED_KERNEL_SETS, resolve_arch_list(arch_list))
