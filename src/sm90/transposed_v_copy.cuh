// V's transposed copy, for the e4m3 configurations with V_transposed_copy: before the attention
// kernel, a copy kernel writes each (batch, kv head)'s V as d_head rows of keys, so that TMA loads
// P V's K-major operand as it is and no warp transposes V in shared memory. Within each 16 keys the
// copy holds them in the order P's registers hold them (fp8_operands.cuh): slots 4u .. 4u + 3 are
// keys 2u, 2u + 1, 2u + 8 and 2u + 9. A row is the keys rounded up to 16 (a whole group, and the
// 16-byte multiple TMA wants of a row's stride), the keys past seqlen_k zeros: a zero probability
// times a zero of V adds nothing, where the bytes past the tensor's keys could be NaNs.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/common.h"
#include "common/cuda_utils.cuh"
#include "common/forward_params.h"
#include "common/ptx.cuh"

namespace flash::sm90 {

// The copy's layout: (batch, heads_kv, d_head, row_keys) bytes.
struct TransposedVLayout {
    static constexpr int KEY_GROUP = 16;
    int64_t row_keys;

    explicit TransposedVLayout(const ForwardParams &params)
        : row_keys((static_cast<int64_t>(params.seqlen_k) + KEY_GROUP - 1) / KEY_GROUP * KEY_GROUP) {}

    int64_t bytes(const ForwardParams &params) const {
        return static_cast<int64_t>(params.batch) * params.heads_kv * params.d_head * row_keys;
    }
    // The elements' strides, as TensorStrides gives them for the (d_head, seq, heads, batch) views of
    // tensor_maps.h: here the view's columns are the keys and its rows d_head.
    TensorStrides strides(const ForwardParams &params) const {
        return {static_cast<int64_t>(params.heads_kv) * params.d_head * row_keys, row_keys,
                static_cast<int64_t>(params.d_head) * row_keys};
    }
};

namespace transposed_v_copy {

// Per block: 4 key groups, each transposed row's part two whole 32-byte sectors. (With the launch
// overlap, this replaced blocks of 128 keys and 256 threads, and a call lost less to the copy; it
// still runs well below the memory's bandwidth: benchmarks/HISTORY.md#2026-12-07-fp8-transposed-v-copy.)
constexpr int TILE_KEYS = 64;
constexpr int THREADS = 128;
constexpr int GROUPS = TILE_KEYS / TransposedVLayout::KEY_GROUP;

// Byte j of a and of b (in the low 16 bits, a's lowest): two keys' values of one column.
__device__ __forceinline__ uint32_t column_pair(uint32_t a, uint32_t b, uint32_t j) { return __byte_perm(a, b, j | (j + 4) << 4); }

// One block: TILE_KEYS keys of one (batch, kv head), every column. The keys go through shared memory
// as rows of 32-bit words (4 columns each, a row padded by 16 bytes), every load of a thread issued
// before the first store; a thread then takes 4 columns of one key group, reading a word of each of
// its 16 keys (a warp reads consecutive words of one row), and writes each column's 16 keys as one
// 16-byte chunk of that column's row. The attention kernel after it may start once every block has
// (programmatic stream serialization): its loading thread waits for this grid before its first V tile.
template <int D_HEAD>
__global__ void __launch_bounds__(THREADS) transpose_v_kernel(const uint8_t *__restrict__ v, TensorStrides v_strides,
                                                               int seqlen_k, uint8_t *__restrict__ out,
                                                               TensorStrides out_strides, int64_t row_keys) {
    constexpr int ROW_WORDS = D_HEAD / 4 + 4;
    constexpr int CHUNKS_PER_KEY = D_HEAD / COPY_BYTES;
    __shared__ __align__(16) uint32_t tile[TILE_KEYS][ROW_WORDS];
    const int first_key = blockIdx.x * TILE_KEYS;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;

    ptx::allow_dependent_launch();
    const uint8_t *const v_head = v + batch * v_strides.batch + head * v_strides.head;
    constexpr int ROUNDS = TILE_KEYS * CHUNKS_PER_KEY / THREADS;
    static_assert(TILE_KEYS * CHUNKS_PER_KEY % THREADS == 0, "the threads load whole rounds of chunks");
    uint4 values[ROUNDS];
#pragma unroll
    for (int round = 0; round < ROUNDS; ++round) {
        const int key = (threadIdx.x + round * THREADS) / CHUNKS_PER_KEY;
        const int chunk = (threadIdx.x + round * THREADS) % CHUNKS_PER_KEY;
        values[round] = first_key + key < seqlen_k ? *reinterpret_cast<const uint4 *>(v_head + (first_key + key) * v_strides.seq +
                                                                                      chunk * COPY_BYTES)
                                                   : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int round = 0; round < ROUNDS; ++round) {
        const int key = (threadIdx.x + round * THREADS) / CHUNKS_PER_KEY;
        const int chunk = (threadIdx.x + round * THREADS) % CHUNKS_PER_KEY;
        *reinterpret_cast<uint4 *>(&tile[key][4 * chunk]) = values[round];
    }
    __syncthreads();

    uint8_t *const out_head = out + batch * out_strides.batch + head * out_strides.head;
#pragma unroll 1
    for (int item = threadIdx.x; item < D_HEAD / 4 * GROUPS; item += THREADS) {
        const int word = item % (D_HEAD / 4);
        const int group = item / (D_HEAD / 4);
        const int64_t group_key = first_key + group * TransposedVLayout::KEY_GROUP;
        if (group_key >= row_keys)
            continue;
        uint32_t keys[16];
#pragma unroll
        for (int k = 0; k < 16; ++k)
            keys[k] = tile[group * TransposedVLayout::KEY_GROUP + k][word];
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) {
            uint32_t slots[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const uint32_t low = column_pair(keys[2 * u], keys[2 * u + 1], j);
                const uint32_t high = column_pair(keys[2 * u + 8], keys[2 * u + 9], j);
                slots[u] = __byte_perm(low, high, 0x5410);
            }
            *reinterpret_cast<uint4 *>(out_head + (4 * word + j) * out_strides.seq + group_key) =
                make_uint4(slots[0], slots[1], slots[2], slots[3]);
        }
    }
}

} // namespace transposed_v_copy

// Writes the call's V (params.v, e4m3) transposed into `out` (TransposedVLayout's bytes), on `stream`.
template <int D_HEAD>
void copy_V_transposed(const ForwardParams &params, void *out, cudaStream_t stream) {
    using namespace transposed_v_copy;
    const TransposedVLayout layout(params);
    const dim3 grid(static_cast<unsigned>((layout.row_keys + TILE_KEYS - 1) / TILE_KEYS), params.heads_kv, params.batch);
    transpose_v_kernel<D_HEAD><<<grid, THREADS, 0, stream>>>(static_cast<const uint8_t *>(params.v), params.v_strides,
                                                             params.seqlen_k, static_cast<uint8_t *>(out),
                                                             layout.strides(params), layout.row_keys);
    check_cuda(cudaGetLastError(), "launching V's transposed copy");
}

} // namespace flash::sm90
