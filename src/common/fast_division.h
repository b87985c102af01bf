// Division by a positive int known at launch without a divide instruction (about twenty
// instructions on the GPU): the binding computes the divisor's reciprocal once (reciprocal_of), and
// the kernels multiply by it (divided). With l = ceil(log2(d)) and m = floor(2^(32 + l) / d) - 2^32 + 1,
// the low word of a 33-bit reciprocal, n / d = (umulhi(n, m) + n) >> l for 0 <= n < 2^31; d = 1
// gives m = 1 and l = 0.
#pragma once

#include <cstdint>

namespace flash {

struct Reciprocal {
    uint32_t multiplier = 1;
    int shift = 0;
};

constexpr Reciprocal reciprocal_of(int divisor) {
    int log2_ceil = 0;
    while ((int64_t{1} << log2_ceil) < divisor)
        ++log2_ceil;
    const uint64_t multiplier = (uint64_t{1} << (32 + log2_ceil)) / static_cast<uint64_t>(divisor) - (uint64_t{1} << 32) + 1;
    return Reciprocal{static_cast<uint32_t>(multiplier), log2_ceil};
}

#ifdef __CUDACC__
__device__ __forceinline__ int divided(int n, const Reciprocal &divisor) {
    const uint32_t u = static_cast<uint32_t>(n);
    return static_cast<int>((__umulhi(u, divisor.multiplier) + u) >> divisor.shift);
}
#endif

} // namespace flash
