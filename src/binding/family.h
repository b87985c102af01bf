// A kernel family as the binding sees it, written once for every family: its configuration read
// from and written to Python, the GPUs it runs on, the problem variant a call needs of one of its
// configurations and the compiled kernel that serves it. A family's binding.h supplies what is its
// own (FamilyInfo: name, requirement, the field list's conversions, the generated registry) and
// names Family<FamilyInfo>.
#pragma once

#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "binding/problem.h"
#include "common/forward_params.h"
#include "common/launcher.h"
#include "common/problem_variant.h"
#include "generated/kernel_registry.h"

namespace flash::binding {

namespace py = pybind11;

// The architectures this module has machine code for, as nvcc numbers them (800, 900, ...): nvcc
// names every compilation's targets in __CUDA_ARCH_LIST__, and the kernels' units are compiled with
// this unit's.
inline const std::vector<int> &compiled_architectures() {
    static const std::vector<int> list{__CUDA_ARCH_LIST__};
    return list;
}

// Whether machine code for one of the compiled architectures runs on a GPU of this compute
// capability (major * 10 + minor): machine code runs on its own major version, at its minor
// version or later. The build embeds no PTX, so no newer major version can run it.
inline bool has_machine_code_for(int capability) {
    for (const int arch : compiled_architectures())
        if (arch / 100 == capability / 10 && arch / 10 % 10 <= capability % 10)
            return true;
    return false;
}

inline std::string compiled_architecture_names() {
    std::string names;
    for (const int arch : compiled_architectures())
        names += (names.empty() ? "sm_" : ", sm_") + std::to_string(arch / 10);
    return names;
}

template <typename Info>
struct Family : Info {
    using Config = typename Info::Config;

    // Whether this build can run the family's kernels on a GPU of this compute capability.
    static bool runs_on(int capability) { return Info::supports(capability) && has_machine_code_for(capability); }

    // The reason it cannot, for a message that starts with the device or architecture.
    static std::string cannot_run_reason(int capability) {
        if (!Info::supports(capability))
            return std::string("the ") + Info::name + " kernels need " + Info::requirement + " (" + Info::instructions + ")";
        return "this build has machine code for " + compiled_architecture_names() + " only; rebuild with sm_" +
               std::to_string(capability) + " in TORCH_CUDA_ARCH_LIST (as " + std::to_string(capability / 10) + "." +
               std::to_string(capability % 10) + ")";
    }

    // The problem variant this configuration runs a problem with: masked tails where a length is
    // not a multiple of its blocks or, in a family that pads the head with them, the call's d_head
    // is below the configuration's; always with score modifications (compiled with masked tails
    // only); per-sequence lengths with masked tails, where the problem has them or `varlen` asks
    // (a split), and always for an FP8 cache (compiled as varlen variants only).
    static ProblemVariant variant_for(const Config &c, const ForwardParams &params, const Problem &problem, bool varlen) {
        if (varlen || problem.kv_e4m3)
            return ProblemVariant{problem.mask, true, problem.score_mods, true, problem.kv_e4m3};
        const bool tails = params.seqlen_q % c.B_r != 0 || params.seqlen_k % c.B_c != 0 ||
                           (Info::pads_head_with_masked_tails && params.d_head < c.d_head);
        return ProblemVariant{problem.mask, problem.score_mods || tails, problem.score_mods, false};
    }

    // The launcher compiled for (c, variant), or null.
    static const ForwardLauncher *find(const Config &c, const ProblemVariant &variant) {
        const auto &kernels = Info::kernels();
        const auto it = kernels.find({c, variant});
        return it == kernels.end() ? nullptr : &it->second;
    }

    // Whether any variant of c is compiled.
    static bool is_compiled(const Config &c) {
        const auto &kernels = Info::kernels();
        const auto it = kernels.lower_bound({c, ProblemVariant{}});
        return it != kernels.end() && it->first.first == c;
    }
};

} // namespace flash::binding
