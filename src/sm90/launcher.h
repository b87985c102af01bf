// The Hopper family's entry in the registry, as the binding sees it: plain C++, no kernel code.
#pragma once

#include "common/launcher.h"
#include "common/problem_variant.h"
#include "sm90/config.h"

namespace flash::sm90 {

// The launcher of the kernel compiled for (CFG, VARIANT). Defined in launcher.cuh; explicitly
// instantiated once per registry entry in the generated units.
template <HopperForwardKernelConfig CFG, ProblemVariant VARIANT>
ForwardLauncher launcher();

} // namespace flash::sm90
