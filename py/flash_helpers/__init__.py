"""Shared helpers for the build, the tests and the benchmarks: kernel configurations, their textual
forms and the named configuration sets. Importable without torch."""

from flash_helpers.kernel_configs import (
    DType,
    FlashForwardKernelConfig,
    get_kernel_configs,
    get_kernels_to_build,
    parse_kernel_name_into_config,
)

__all__ = [
    "DType",
    "FlashForwardKernelConfig",
    "get_kernel_configs",
    "get_kernels_to_build",
    "parse_kernel_name_into_config",
]
