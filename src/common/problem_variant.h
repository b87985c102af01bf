// A problem variant: the compile-time specialization a problem needs and a tuning choice does not.
// It is half of a kernel's registry key (the other half is the family's tuning configuration), so
// the masking code exists only in the kernels that need it and interior tiles pay for none of it.
#pragma once

#include <compare>

namespace flash {

enum class MaskKind : int {
    NONE = 0,   // every key is attended
    CAUSAL = 1, // keys past the bottom-right-aligned diagonal are masked
    LOCAL = 2,  // keys outside a window around that diagonal are masked
};

struct ProblemVariant {
    MaskKind mask;
    // The last query block and the last key/value tile may be partial: seqlen_q and seqlen_k need
    // not be multiples of the block sizes.
    bool masked_tails;
    // The scores are modified before the softmax: capped (softcap) and/or given ALiBi biases; which
    // of the two, the parameter block says.
    bool score_mods;
    // Each sequence of the batch has lengths of its own (ForwardParams::sequences): cu_seqlens,
    // seqused or leftpad. Compiled with masked tails.
    bool varlen;
    // K and V are an FP8 cache: e4m3 values with per-(batch, kv head) dequantisation factors, read
    // beside 16-bit queries (ForwardParams::descales k and v). Compiled with varlen only, for the
    // SM80 family's decoding configurations, whose products read the e4m3 tiles in shared memory
    // and widen them to float16 in registers.
    bool kv_e4m3 = false;

    constexpr auto operator<=>(const ProblemVariant &) const = default;
};

} // namespace flash
