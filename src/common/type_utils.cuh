// The element type of each DType, and conversions between float32 and the 16-bit ones.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common/dtype.h"

namespace flash {

template <DType dtype>
using element_t = std::conditional_t<dtype == DType::FP16, half,
                                     std::conditional_t<dtype == DType::E4M3, __nv_fp8_e4m3, nv_bfloat16>>;

// Rounds two floats to the 16-bit type and packs them into one register, lo in the low half.
template <typename value_t>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
    if constexpr (std::is_same_v<value_t, half>) {
        const half2 pair = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&pair);
    } else {
        const nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&pair);
    }
}

template <typename value_t>
__device__ __forceinline__ float to_float(value_t x) {
    if constexpr (std::is_same_v<value_t, float>)
        return x;
    else if constexpr (std::is_same_v<value_t, half>)
        return __half2float(x);
    else
        return __bfloat162float(x);
}

// The two 16-bit values of one register as floats, the low half's in x (pack_pair's inverse).
template <typename value_t>
__device__ __forceinline__ float2 unpack_pair(uint32_t pair) {
    const uint16_t lo = pair & 0xffffu, hi = pair >> 16;
    return make_float2(to_float(*reinterpret_cast<const value_t *>(&lo)), to_float(*reinterpret_cast<const value_t *>(&hi)));
}

template <typename value_t>
__device__ __forceinline__ value_t from_float(float x) {
    if constexpr (std::is_same_v<value_t, half>)
        return __float2half_rn(x);
    else
        return __float2bfloat16_rn(x);
}

} // namespace flash
