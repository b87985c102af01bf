// e4m3 values inside the kernels, wherever they are read: the dequantisation factors of FP8
// inputs and caches (FlashAttention-3's descales, one per (batch, kv head)), and the widening of
// stored e4m3 values to float16. Every e4m3 value (finite ones from 2^-9 to 448, and NaN) is
// exactly a float16 value, so widening loses nothing.
#pragma once

#include <cstdint>

#include "common/forward_params.h"

namespace flash {

// The factor of (batch, kv head) of one input; 1 without factors.
__device__ __forceinline__ float descale_at(const Descale &descale, int batch, int kv_head) {
    return descale.data == nullptr ? 1.0f : descale.data[batch * descale.batch_stride + kv_head * descale.head_stride];
}

// Two e4m3 values (the low byte's in the low half) as a float16 pair, in one instruction.
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t two_bytes) {
    uint32_t halves;
    asm("{\n.reg .b16 pair;\n"
        "cvt.u16.u32 pair, %1;\n"
        "cvt.rn.f16x2.e4m3x2 %0, pair;\n}\n"
        : "=r"(halves)
        : "r"(two_bytes));
    return halves;
}

} // namespace flash
