// The Hopper family as the binding sees it: its name, the GPUs it needs, its field list's Python
// conversions and its compiled kernels. Binding code only (pybind11); the rest of what the binding
// knows of a family is binding/family.h's, written once for both.
#pragma once

#include "binding/family.h"
#include "binding/python_fields.h"
#include "generated/kernel_registry.h"
#include "sm90/config.h"

namespace flash::sm90 {

struct FamilyInfo {
    using Config = HopperForwardKernelConfig;
    static constexpr const char *name = "sm90";
    // sm_90a machine code (wgmma, setmaxnreg) runs on compute capability 9.0 only.
    static constexpr bool supports(int capability) { return capability == 90; }
    static constexpr const char *requirement = "sm_90 (H100, H200)";
    static constexpr const char *instructions = "wgmma, TMA, setmaxnreg: sm_90a machine code";
    // A head size below the configuration's runs in every variant: the tensor maps' columns end at
    // the call's d_head, so TMA reads zeros past it and drops the stores there.
    static constexpr bool pads_head_with_masked_tails = false;
    // Its kernels walk every key tile of a query block: a call is never split over the keys.
    static constexpr bool splits_keys = false;
    // Its loading thread reads a paged cache with a TMA box per page of a KV tile: pages shorter than
    // this make a tile many boxes and table reads, and the SM80 family's copies read them faster
    // (BENCHMARKS.md, "Decoding"), so the automatic choice leaves them to it where it runs them.
    static constexpr int fast_page_size = 64;
    // Why a configuration has no kernel for a call whatever the build (null where it may have one):
    // V's transposed copy is laid out for dense calls.
    static const char *unserved_reason(const Config &c, const ForwardParams &, const binding::Problem &problem) {
        if (c.V_transposed_copy && problem.varlen)
            return "V_transposed_copy (vtcopy) runs dense calls alone, not varlen, paged or KV-cache ones";
        return nullptr;
    }

    FLASH_CONFIG_PYTHON_CONVERSIONS(HopperForwardKernelConfig, FLASH_SM90_CONFIG_FIELDS)

    // Its compiled kernels, from the generated registry (none where the build has no sm_90a).
    static const auto &kernels() { return compiled_kernels; }
};

using Family = binding::Family<FamilyInfo>;

} // namespace flash::sm90
