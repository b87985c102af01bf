// e4m3 values inside the kernels, wherever they are read: the dequantisation factors of FP8
// inputs and caches (FlashAttention-3's descales, one per (batch, kv head)), and the widening of
// stored e4m3 values to a 16-bit type. Every e4m3 value (finite ones from 2^-9 to 448, and NaN) is
// exactly a float16 and a bfloat16 value, so widening loses nothing.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/forward_params.h"

namespace flash {

// The factor of (batch, kv head) of one input; 1 without factors.
__device__ __forceinline__ float descale_at(const Descale &descale, int batch, int kv_head) {
    return descale.data == nullptr ? 1.0f : descale.data[batch * descale.batch_stride + kv_head * descale.head_stride];
}

// Two e4m3 values (the low byte's in the low half) as a pair of value_t. The hardware widens e4m3
// to float16 alone; a bfloat16 pair goes on through float32, where both conversions are exact.
template <typename value_t>
__device__ __forceinline__ uint32_t widen_e4m3x2(uint32_t two_bytes) {
    uint32_t halves;
    asm("{\n.reg .b16 pair;\n"
        "cvt.u16.u32 pair, %1;\n"
        "cvt.rn.f16x2.e4m3x2 %0, pair;\n}\n"
        : "=r"(halves)
        : "r"(two_bytes));
    if constexpr (std::is_same_v<value_t, half>) {
        return halves;
    } else {
        static_assert(std::is_same_v<value_t, nv_bfloat16>, "e4m3 widens to float16 or bfloat16");
        uint32_t pair;
        asm("{\n.reg .f32 lo, hi;\n.reg .b16 h_lo, h_hi;\n"
            "mov.b32 {h_lo, h_hi}, %1;\n"
            "cvt.f32.f16 lo, h_lo;\n"
            "cvt.f32.f16 hi, h_hi;\n"
            "cvt.rn.bf16x2.f32 %0, hi, lo;\n}\n"
            : "=r"(pair)
            : "r"(halves));
        return pair;
    }
}

// Eight e4m3 values (a 64-bit word, the first in the lowest byte) as eight value_t (a 16-byte
// chunk, the first in the lowest half).
template <typename value_t>
__device__ __forceinline__ uint4 widen_e4m3x8(uint2 bytes) {
    return uint4{widen_e4m3x2<value_t>(bytes.x & 0xffffu), widen_e4m3x2<value_t>(bytes.x >> 16),
                 widen_e4m3x2<value_t>(bytes.y & 0xffffu), widen_e4m3x2<value_t>(bytes.y >> 16)};
}

} // namespace flash
