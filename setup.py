"""Builds the CUDA extension flash_attention._C and installs the packages under py/.

The kernel instantiations are generated first (tools/build/generate_kernel_instantiations.py), so
the kernel map can never be stale. FLASH_BUILD_KERNELS picks the compiled set (see README.md);
TORCH_CUDA_ARCH_LIST overrides the default targets, real machine code for sm_80 and sm_90. Its 9.0
is compiled as 9.0a (sm_90a, which the Hopper family needs and which runs on sm_90 alone), and the
Hopper family's configurations are compiled only when it has 9.0. FLASH_BUILD_PTX_ONLY=1 compiles
PTX alone for those architectures (no machine code: CI's build, which only has to compile and import).
"""

import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent.resolve()
sys.path[:0] = [str(ROOT / "py"), str(ROOT / "tools" / "build")]

from flash_helpers.build_env import (  # noqa: E402
    ARCH_LIST_ENV,
    arch_list_for_build,
    ptx_only_gencode_flags,
    resolve_arch_list,
    resolve_build_kernels_key,
)
from flash_helpers.kernel_sets import get_kernels_to_build  # noqa: E402
from generate_kernel_instantiations import generate  # noqa: E402

# torch's extension builder takes the targets' -gencode flags from this variable.
arch_list = resolve_arch_list()
os.environ[ARCH_LIST_ENV] = arch_list_for_build(arch_list)

from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402

kernel_set = resolve_build_kernels_key()
instantiations = generate(get_kernels_to_build(kernel_set, arch_list), ROOT / "src", kernel_set)
# The binding, the split-KV combine kernel (shared by the families), the KV cache append kernel, the
# Hopper family's varlen planning kernel (shared by its configurations), then one unit per configuration.
shared_units = ["src/flash_attention.cu", "src/split_kv/combine.cu", "src/kvcache/append.cu", "src/sm90/varlen_work_plan.cu"]
sources = shared_units + [str(path.relative_to(ROOT)) for path in instantiations]

setup(
    ext_modules=[
        CUDAExtension(
            name="flash_attention._C",
            sources=sources,
            include_dirs=[str(ROOT / "src")],
            extra_compile_args={
                "cxx": ["-O3", "-std=c++20"],
                # 3189 and relaxed constexpr: torch's own headers, read by nvcc in C++20 mode.
                # Explicit -gencode flags (PTX alone) replace those torch derives from the list.
                "nvcc": ["-O3", "-std=c++20", "-lineinfo", "-diag-suppress=3189", "--expt-relaxed-constexpr"]
                + ptx_only_gencode_flags(os.environ[ARCH_LIST_ENV]),
            },
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
