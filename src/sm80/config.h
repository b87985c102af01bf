// The SM80 family's configuration: the key of its kernels in the registry, one field per tuning
// choice. Shared by the kernel (as a template argument) and the binding; needs no torch or CUDA
// headers.
#pragma once

#include <compare>

#include "common/dtype.h"

namespace flash::sm80 {

// The fields, in order, stated once: the struct below, the binding's conversions from and to
// Python and its descriptions are all written from this list. The order is the Python dataclass's
// and the ordering's (member-wise, dtype by its code, false < true).
#define FLASH_SM80_CONFIG_FIELDS(FIELD)                                                                           \
    FIELD(DType, dtype)                                                                                           \
    FIELD(int, d_head)                                                                                            \
    FIELD(int, B_r)     /* query rows per thread block */                                                         \
    FIELD(int, B_c)     /* key/value rows per KV tile */                                                          \
    FIELD(int, n_warps) /* warps per thread block */                                                              \
    FIELD(bool, async_copy)                                                                                       \
    FIELD(bool, eager_load_blocks)                                                                                \
    FIELD(bool, swizzled)                                                                                         \
    FIELD(int, Q_mma_load_K_tiles) /* k-slices of Q brought into registers at a time; 0 = all, kept throughout */ \
    FIELD(int, K_mma_load_K_tiles) /* k-slices of K brought into registers at a time; 0 = the whole tile */       \
    FIELD(int, V_mma_load_K_tiles) /* k-slices of V brought into registers at a time; 0 = the whole tile */       \
    FIELD(bool, mma_double_buffer_loads)                                                                          \
    FIELD(bool, optimized_softmax)

// One kernel variant. A structural type: it is the template argument of StaticForwardKernelConfig.
struct FlashForwardKernelConfig {
#define FLASH_DECLARE_FIELD(type, name) type name;
    FLASH_SM80_CONFIG_FIELDS(FLASH_DECLARE_FIELD)
#undef FLASH_DECLARE_FIELD

    constexpr auto operator<=>(const FlashForwardKernelConfig &) const = default;
};

} // namespace flash::sm80
