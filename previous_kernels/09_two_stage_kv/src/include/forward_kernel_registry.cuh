// What the binding needs to name a kernel without compiling it: the kernel pointer type and the
// accessor that each generated instantiation unit defines. A __global__ function's host stub has
// internal linkage, so a kernel can only be reached from another translation unit through a
// function defined next to it. Plain C++: the binding includes no kernel code.
#pragma once

#include "flash_config.cuh"

namespace flash {

using forward_kernel_fn = void (*)(ForwardKernelArgs);

// The kernel compiled for CFG. Defined in forward_kernel.cuh; explicitly instantiated once per
// config in the generated units under src/instantiations/.
template <FlashForwardKernelConfig CFG>
forward_kernel_fn forward_kernel_pointer();

} // namespace flash
