"""The build's environment: which set ``FLASH_BUILD_KERNELS`` names, which architectures
``TORCH_CUDA_ARCH_LIST`` lists (and how the build passes them on to torch), whether
``FLASH_BUILD_PTX_ONLY`` asks for PTX alone, and the hint for a configuration that was not compiled.
Importable without torch.
"""

from __future__ import annotations

import os
import re

__all__ = [
    "ARCH_LIST_ENV",
    "BUILD_KERNELS_ENV",
    "DEFAULT_ARCH_LIST",
    "PTX_ONLY_ENV",
    "REBUILD_HINT",
    "arch_list_for_build",
    "ptx_only_gencode_flags",
    "resolve_arch_list",
    "resolve_build_kernels_key",
    "sm90_in_arch_list",
]

BUILD_KERNELS_ENV = "FLASH_BUILD_KERNELS"
ARCH_LIST_ENV = "TORCH_CUDA_ARCH_LIST"
PTX_ONLY_ENV = "FLASH_BUILD_PTX_ONLY"
# The architectures a build compiles for unless TORCH_CUDA_ARCH_LIST says otherwise: sm_80 and sm_90.
DEFAULT_ARCH_LIST = "8.0;9.0"
# What to do about a configuration that is not compiled; the binding's message says it too (the
# generator writes it into the registry).
REBUILD_HINT = (
    f"build a set containing it: {BUILD_KERNELS_ENV}=<default|prog|progall|tune|all|B_r,B_c> "
    f"pip install --no-build-isolation -e . (Hopper configurations also need 9.0 in {ARCH_LIST_ENV})"
)


def resolve_build_kernels_key(key: str | None = None) -> str:
    """The build's kernel-set key: ``key``, else ``FLASH_BUILD_KERNELS``, else ``default``."""
    return key if key is not None else os.environ.get(BUILD_KERNELS_ENV) or "default"


def resolve_arch_list(arch_list: str | None = None) -> str:
    """The build's architectures: ``arch_list``, else ``TORCH_CUDA_ARCH_LIST``, else ``DEFAULT_ARCH_LIST``."""
    return arch_list if arch_list is not None else os.environ.get(ARCH_LIST_ENV) or DEFAULT_ARCH_LIST


# A 9.0 entry of an architecture list as torch's extension builder reads TORCH_CUDA_ARCH_LIST
# (entries separated by ';' or spaces, each optionally suffixed with +PTX), plain or as 9.0a.
_SM90_ENTRY_RE = re.compile(r"(?<![^;\s])9\.0a?(?=\+PTX|[;\s]|$)")


def sm90_in_arch_list(arch_list: str) -> bool:
    """Whether a build for these architectures compiles the Hopper family: it needs an sm_90 entry
    (9.0 or 9.0a, with or without +PTX)."""
    return _SM90_ENTRY_RE.search(arch_list) is not None


def arch_list_for_build(arch_list: str) -> str:
    """The architecture list to give torch's extension builder: 9.0 becomes 9.0a, the sm_90a machine
    code that the Hopper family's wgmma and setmaxnreg need (it runs on sm_90 alone; the SM80
    family's kernels compile the same for it). The other entries, suffixes and separators stay."""
    return _SM90_ENTRY_RE.sub("9.0a", arch_list)


# An architecture entry as arch_list_for_build leaves it: major.minor, an optional a, an optional +PTX.
_ARCH_ENTRY_RE = re.compile(r"^(\d+)\.(\d+)(a?)(\+PTX)?$")


def ptx_only_gencode_flags(arch_list: str, env: dict[str, str] | None = None) -> list[str]:
    """nvcc's -gencode flags for PTX alone (``code=compute_XX``) at each architecture of
    ``arch_list`` (as arch_list_for_build gives it), where ``FLASH_BUILD_PTX_ONLY`` is 1; else none,
    and torch's builder adds machine code for the list. PTX alone skips ptxas, about a third of a
    kernel's compile time: a build that only has to compile and import (CI, which has no GPU) is
    that much faster, and a GPU would compile the kernels from PTX on their first launch."""
    env = os.environ if env is None else env
    if env.get(PTX_ONLY_ENV, "0") != "1":
        return []
    flags = []
    for entry in re.split(r"[;\s]+", arch_list.strip()):
        match = _ARCH_ENTRY_RE.match(entry)
        if match is None:
            raise ValueError(f"{ARCH_LIST_ENV}: {entry!r} is not an architecture such as 8.0 or 9.0a ({PTX_ONLY_ENV}=1)")
        arch = f"{match[1]}{match[2]}{match[3]}"
        flags.append(f"-gencode=arch=compute_{arch},code=compute_{arch}")
    return flags
