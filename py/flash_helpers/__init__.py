"""Shared helpers for the build, the tests and the benchmarks: the kernel families' configurations,
their textual forms, problem variants and the named configuration sets. Importable without torch.

- ``dtypes``: the element types;
- ``problem``: problem variants and FLOP counts;
- ``kernel_config``: what every family's configuration shares (type checks, order, C++ spellings);
- ``sm80_config``: the SM80 family's configuration, its values and validity rules;
- ``sm90_config``: the Hopper family's configuration, its values and validity rules;
- ``kernel_names``: parsing short forms and demangled kernel names;
- ``build_env``: the build's environment variables, its architecture list and the rebuild hint;
- ``tuning_space``: every family's configuration space, and what autotuning sweeps;
- ``progression_steps``: every family's optimisation history, step by step;
- ``default_set``: what a plain install compiles;
- ``kernel_sets``: the named sets, their selection by key, and the build's selection for its
  target architectures;
- ``families``: every family's configuration type, by name;
- ``reference``: the float32 reference and the correctness criterion (needs torch when called).
"""

from flash_helpers.dtypes import DType
from flash_helpers.families import FAMILIES
from flash_helpers.kernel_names import parse_kernel_name_into_config
from flash_helpers.kernel_sets import get_kernel_configs, get_kernels_to_build
from flash_helpers.problem import MaskKind, ProblemVariant
from flash_helpers.sm80_config import FlashForwardKernelConfig
from flash_helpers.sm90_config import HopperForwardKernelConfig

__all__ = [
    "FAMILIES",
    "DType",
    "FlashForwardKernelConfig",
    "HopperForwardKernelConfig",
    "MaskKind",
    "ProblemVariant",
    "get_kernel_configs",
    "get_kernels_to_build",
    "parse_kernel_name_into_config",
]
