// The SM80 family as the binding sees it: its name, the GPUs it needs, its field list's Python
// conversions and its compiled kernels. Binding code only (pybind11); the rest of what the binding
// knows of a family is binding/family.h's, written once for both.
#pragma once

#include "binding/family.h"
#include "binding/python_fields.h"
#include "common/forward_params.h"
#include "generated/kernel_registry.h"
#include "sm80/config.h"

namespace flash::sm80 {

struct FamilyInfo {
    using Config = FlashForwardKernelConfig;
    static constexpr const char *name = "sm80";
    // mma.sync with bf16 and cp.async exist from sm_80 on (compute capability major * 10 + minor).
    static constexpr bool supports(int capability) { return capability >= 80; }
    static constexpr const char *requirement = "sm_80 or newer";
    static constexpr const char *instructions = "mma.sync.m16n8k16, ldmatrix, cp.async";
    // A head size below the configuration's runs in place with masked tails, whose copies predicate
    // the columns past the call's d_head (the other variants move whole rows of the configuration's).
    static constexpr bool pads_head_with_masked_tails = true;
    // Its varlen variant splits the keys over several blocks (SplitKV) where the call asks.
    static constexpr bool splits_keys = true;
    // Its copies read a paged cache a page per 16 keys whatever the page size.
    static constexpr int fast_page_size = PagedKV::ROWS_MULTIPLE;
    // Every call a configuration's variants cover may be compiled.
    static const char *unserved_reason(const Config &, const ForwardParams &, const binding::Problem &) { return nullptr; }

    FLASH_CONFIG_PYTHON_CONVERSIONS(FlashForwardKernelConfig, FLASH_SM80_CONFIG_FIELDS)

    static const auto &kernels() { return compiled_kernels; }
};

using Family = binding::Family<FamilyInfo>;

} // namespace flash::sm80
