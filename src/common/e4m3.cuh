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

// Four e4m3 values as two float16 pairs: bytes 0 and 1 in .x, 2 and 3 in .y (the lower byte's in
// each pair's low half). Each conversion reads its half of the word in place (F2FP's .H1 operand):
// extracting the halves first (a mask or a permute, and a shift) took as many instructions as the
// conversions themselves (benchmarks/HISTORY.md #2026-12-04-fp8-cache-issue-and-occupancy).
__device__ __forceinline__ uint2 e4m3x4_to_half2x2(uint32_t four_bytes) {
    uint2 pairs;
    asm("{\n.reg .b16 low, high;\n"
        "mov.b32 {low, high}, %2;\n"
        "cvt.rn.f16x2.e4m3x2 %0, low;\n"
        "cvt.rn.f16x2.e4m3x2 %1, high;\n}\n"
        : "=r"(pairs.x), "=r"(pairs.y)
        : "r"(four_bytes));
    return pairs;
}

} // namespace flash
