// The Hopper family's configuration: the key of its kernels in the registry, one field per tuning
// choice. Shared by the kernel (as a template argument) and the binding; needs no torch or CUDA
// headers.
#pragma once

#include <compare>

#include "common/dtype.h"

namespace flash::sm90 {

// The fields, in order, stated once: the struct below and the binding's conversions from and to
// Python and its descriptions are all written from this list. The order is the Python
// dataclass's (flash_helpers/sm90_config.py) and the ordering's.
#define FLASH_SM90_CONFIG_FIELDS(FIELD)                                                                      \
    FIELD(DType, dtype)                                                                                      \
    FIELD(int, d_head)                                                                                       \
    FIELD(int, B_r)    /* query rows per thread block: 64 per consumer warpgroup */                          \
    FIELD(int, B_c)    /* key/value rows per KV tile */                                                      \
    FIELD(int, stages) /* KV tiles in the shared-memory pipeline */                                          \
    FIELD(bool, warp_specialized) /* a producer warpgroup issues the loads; consumers take its registers */  \
    FIELD(bool, pingpong)         /* consumer warpgroups take turns issuing their products */                \
    FIELD(bool, intra_wg_overlap) /* a warpgroup's softmax runs while its previous P V product does */      \
    FIELD(bool, persistent)       /* one block per SM walks over the work tiles */                       \
    FIELD(bool, Q_in_registers)   /* S = Q K^T takes Q from registers, K alone from shared memory */    \
    FIELD(bool, multicast)        /* a cluster of two blocks loads each K/V tile once, for both */      \
    FIELD(bool, V_transposed_copy) /* e4m3: a copy kernel transposes V first; TMA loads its tiles */     \
    FIELD(bool, deferred_O_rescale) /* with the overlap: O is rescaled in the next turn, not after P V */

// One kernel variant. A structural type: it is the template argument of StaticHopperKernelConfig.
struct HopperForwardKernelConfig {
#define FLASH_DECLARE_FIELD(type, name) type name;
    FLASH_SM90_CONFIG_FIELDS(FLASH_DECLARE_FIELD)
#undef FLASH_DECLARE_FIELD

    constexpr auto operator<=>(const HopperForwardKernelConfig &) const = default;
};

} // namespace flash::sm90
