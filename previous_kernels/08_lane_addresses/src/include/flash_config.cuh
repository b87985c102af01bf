// The run-time kernel configuration (the key of the kernel map) and the kernel's launch arguments.
// Shared by the kernel headers (device code) and the binding (host code); needs no torch headers.
#pragma once

#include <compare>
#include <cstdint>

namespace flash {

// Element type of q, k, v and o. The values are torch's ScalarType codes, so the Python helpers
// and the binding agree on them without importing torch.
enum class DType : int { FP16 = 5, BF16 = 15 };

// One kernel variant. A structural type: it is the template argument of StaticForwardKernelConfig,
// and its field order is the order of the Python dataclass, of the generated initializers and of
// the ordering below (member-wise, dtype by its code, false < true).
struct FlashForwardKernelConfig {
    DType dtype;
    int d_head;
    int B_r;     // query rows per thread block
    int B_c;     // key/value rows per KV tile
    int n_warps; // warps per thread block
    bool async_copy;
    bool eager_load_blocks;
    bool swizzled;
    int Q_mma_load_K_tiles; // k-slices of Q brought into registers at a time; 0 = all, kept for the whole kernel
    int K_mma_load_K_tiles; // k-slices of K brought into registers at a time; 0 = the whole tile
    int V_mma_load_K_tiles; // k-slices of V brought into registers at a time; 0 = the whole tile
    bool mma_double_buffer_loads;
    bool optimized_softmax;

    constexpr auto operator<=>(const FlashForwardKernelConfig &) const = default;

    // Dynamic shared memory of one block: the Q tile, one K tile and one V tile of 2-byte elements.
    constexpr int smem_bytes() const { return (B_r + 2 * B_c) * d_head * 2; }
};

// Element strides of one (batch, seq, heads, d_head) tensor; the last dimension is contiguous.
struct TensorStrides {
    int64_t batch;
    int64_t seq;
    int64_t head;
};

struct ForwardKernelArgs {
    const void *Q;
    const void *K;
    const void *V;
    void *O;
    TensorStrides Q_strides;
    TensorStrides K_strides;
    TensorStrides V_strides;
    TensorStrides O_strides;
    float softmax_scale; // multiplies Q K^T before the softmax
    int seq_len;
    int n_heads;
    int n_Q_blocks;  // seq_len / B_r: gridDim.x
    int n_KV_blocks; // seq_len / B_c: iterations of the main loop
};

} // namespace flash
