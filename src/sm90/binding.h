// The Hopper family as the binding sees it: its configuration read from and written to Python, the
// device it needs, and the problem variant a call selects. Binding code only (pybind11).
#pragma once

#include <string>

#include <pybind11/pybind11.h>

#include "common/forward_params.h"
#include "common/problem_variant.h"
#include "common/python_fields.h"
#include "generated/kernel_registry.h"
#include "sm90/config.h"

namespace flash::sm90 {

namespace py = pybind11;

struct Family {
    using Config = HopperForwardKernelConfig;
    static constexpr const char *name = "sm90";
    // sm_90a machine code (wgmma, setmaxnreg) runs on compute capability 9.0 only.
    static constexpr bool runs_on(int capability) { return capability == 90; }
    static constexpr const char *requirement = "sm_90 (H100, H200)";
    static constexpr const char *instructions = "wgmma, TMA, setmaxnreg: sm_90a machine code";

    FLASH_CONFIG_PYTHON_CONVERSIONS(HopperForwardKernelConfig, FLASH_SM90_CONFIG_FIELDS)

    // Its compiled kernels, from the generated registry (none where the build has no sm_90a).
    static const auto &kernels() { return compiled_kernels; }

    static DType dtype(const Config &c) { return c.dtype; }
    static int d_head(const Config &c) { return c.d_head; }

    // Whether a call needs the masked-tails variant: a partial last query block or key/value tile.
    static bool needs_masked_tails(const Config &c, const ForwardParams &params) {
        return params.seqlen_q % c.B_r != 0 || params.seqlen_k % c.B_c != 0;
    }
};

} // namespace flash::sm90
