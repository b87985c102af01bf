// The SM80 family's entry in the registry, as the binding sees it: plain C++, no kernel code.
#pragma once

#include "common/launcher.h"
#include "common/problem_variant.h"
#include "sm80/config.h"

namespace flash::sm80 {

// The launcher of the kernel compiled for (CFG, VARIANT). Defined in launcher.cuh; explicitly
// instantiated once per registry entry in the generated units. (A __global__ function's host stub
// has internal linkage, so a kernel can only be reached from another translation unit through a
// function defined next to it.)
template <FlashForwardKernelConfig CFG, ProblemVariant VARIANT>
ForwardLauncher launcher();

} // namespace flash::sm80
