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

// The copy's layout: (batch, heads_kv, d_head, row_keys) bytes, d_head the call's.
struct TransposedVLayout {
    static constexpr int KEY_GROUP = 16;
    int64_t batch, heads_kv, d_head, row_keys;

    explicit TransposedVLayout(const ForwardParams &params)
        : batch(params.batch), heads_kv(params.heads_kv), d_head(params.d_head),
          row_keys((static_cast<int64_t>(params.seqlen_k) + KEY_GROUP - 1) / KEY_GROUP * KEY_GROUP) {}

    int64_t bytes() const { return batch * heads_kv * d_head * row_keys; }
    // The elements' strides, as TensorStrides gives them for the (d_head, seq, heads, batch) views of
    // tensor_maps.h: here the view's columns are the keys and its rows d_head.
    TensorStrides strides() const { return {heads_kv * d_head * row_keys, row_keys, d_head * row_keys}; }
};

namespace transposed_v_copy {

constexpr int THREADS = 128;

// A block's tile: KEYS keys by COLUMNS columns of one (batch, kv head), at most 16 KiB. In shared
// memory it is KEY_GROUP-key groups of key rows of 4-column words. The transposing phase gives a
// warp's consecutive lanes LANE_GROUPS consecutive groups (so that each column's keys are written
// as one run of LANE_GROUPS 16-byte chunks of its row) and 32 / LANE_GROUPS consecutive words; a
// group's padding of GROUP_PAD words puts the 32 lanes' words in 32 different banks.
template <int D_HEAD, int TILE_KEYS>
struct Tile {
    static constexpr int MAX_BYTES = 16 * 1024;
    static constexpr int KEYS = TILE_KEYS;
    static constexpr int COLUMNS = D_HEAD < MAX_BYTES / KEYS ? D_HEAD : MAX_BYTES / KEYS;
    static constexpr int GROUPS = KEYS / TransposedVLayout::KEY_GROUP;
    static constexpr int WORDS = COLUMNS / 4;
    static constexpr int CHUNKS = COLUMNS / COPY_BYTES;
    static constexpr int LANE_GROUPS = GROUPS < 8 ? GROUPS : 8;
    static constexpr int GROUP_PAD = 32 / LANE_GROUPS;
    static constexpr int GROUP_WORDS = TransposedVLayout::KEY_GROUP * WORDS + GROUP_PAD;
    static constexpr int COLUMN_TILES = D_HEAD / COLUMNS;
    static_assert(KEYS % 64 == 0 && D_HEAD % COLUMNS == 0 && COLUMNS % 64 == 0 && WORDS % GROUP_PAD == 0,
                  "whole 16-byte chunks, conflict-free banks and whole tiles of the head");
    static_assert(KEYS * CHUNKS % THREADS == 0, "the threads load whole rounds of chunks");
};

// The keys per block, chosen by tools/benchmark/transposed_v_copy_bench.py: on the H100, 64 keys
// copied at 0.90-0.98 of a torch copy's bandwidth, 128 keys at 0.87-0.98 and 256 at 0.86-0.91.
constexpr int TILE_KEYS = 64;

// Byte j of a and of b (in the low 16 bits, a's lowest): two keys' values of one column.
__device__ __forceinline__ uint32_t column_pair(uint32_t a, uint32_t b, uint32_t j) { return __byte_perm(a, b, j | (j + 4) << 4); }

// One block: a Tile of one (batch, kv head), copied into shared memory; a thread then takes 4 columns
// of one key group, reading a word of each of its 16 keys, and writes each column's 16 keys as one
// 16-byte chunk of that column's row. Keys past seqlen_k are zeros; columns past the call's d_head (a
// head below the configuration's) are neither read nor written. The attention kernel after it may
// start once every block has (programmatic stream serialization): its loading thread waits for this
// grid before its first V tile.
template <int D_HEAD, int TILE_KEYS>
__global__ void __launch_bounds__(THREADS) transpose_v_kernel(const uint8_t *__restrict__ v, TensorStrides v_strides,
                                                               int seqlen_k, int d_head, uint8_t *__restrict__ out,
                                                               TensorStrides out_strides, int64_t row_keys) {
    using T = Tile<D_HEAD, TILE_KEYS>;
    __shared__ __align__(16) uint32_t tile[T::GROUPS * T::GROUP_WORDS];
    const int first_key = blockIdx.x / T::COLUMN_TILES * T::KEYS;
    const int first_column = blockIdx.x % T::COLUMN_TILES * T::COLUMNS;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;

    ptx::allow_dependent_launch();
    if (first_column >= d_head)
        return;
    // cp.async straight into shared memory: every chunk of the tile in flight at once, no registers
    // held, and a chunk outside the keys or the head a zero that reads nothing.
    const uint8_t *const v_tile = v + batch * v_strides.batch + head * v_strides.head + first_key * v_strides.seq + first_column;
#pragma unroll
    for (int round = 0; round < T::KEYS * T::CHUNKS / THREADS; ++round) {
        const int key = (threadIdx.x + round * THREADS) / T::CHUNKS;
        const int chunk = (threadIdx.x + round * THREADS) % T::CHUNKS;
        const bool inside = first_key + key < seqlen_k && first_column + chunk * COPY_BYTES < d_head;
        const int group = key / TransposedVLayout::KEY_GROUP;
        const int row = key % TransposedVLayout::KEY_GROUP;
        ptx::cp_async_16_zfill(ptx::shared_address(&tile[group * T::GROUP_WORDS + row * T::WORDS + 4 * chunk]),
                               v_tile + (inside ? key * v_strides.seq + chunk * COPY_BYTES : 0), inside ? COPY_BYTES : 0);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<0>();
    __syncthreads();

    uint8_t *const out_tile = out + batch * out_strides.batch + head * out_strides.head + first_column * out_strides.seq;
    constexpr int ITEMS = T::GROUPS * T::WORDS;
#pragma unroll
    for (int pass = 0; pass < (ITEMS + THREADS - 1) / THREADS; ++pass) {
        const int item = threadIdx.x + pass * THREADS;
        if (item >= ITEMS)
            break;
        const int group = item % T::LANE_GROUPS + item / (T::LANE_GROUPS * T::WORDS) * T::LANE_GROUPS;
        const int word = item / T::LANE_GROUPS % T::WORDS;
        const int64_t group_key = first_key + group * TransposedVLayout::KEY_GROUP;
        if (group_key >= row_keys || first_column + 4 * word >= d_head)
            continue;
        uint32_t keys[TransposedVLayout::KEY_GROUP];
#pragma unroll
        for (int k = 0; k < TransposedVLayout::KEY_GROUP; ++k)
            keys[k] = tile[group * T::GROUP_WORDS + k * T::WORDS + word];
#pragma unroll
        for (uint32_t j = 0; j < 4; ++j) {
            uint32_t slots[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const uint32_t low = column_pair(keys[2 * u], keys[2 * u + 1], j);
                const uint32_t high = column_pair(keys[2 * u + 8], keys[2 * u + 9], j);
                slots[u] = __byte_perm(low, high, 0x5410);
            }
            *reinterpret_cast<uint4 *>(out_tile + (4 * word + j) * out_strides.seq + group_key) =
                make_uint4(slots[0], slots[1], slots[2], slots[3]);
        }
    }
}

} // namespace transposed_v_copy

// Writes the call's V (params.v, e4m3) transposed into `out` (TransposedVLayout's bytes), on `stream`,
// in blocks of TILE_KEYS keys.
template <int D_HEAD, int TILE_KEYS = transposed_v_copy::TILE_KEYS>
void copy_V_transposed(const ForwardParams &params, void *out, cudaStream_t stream) {
    using namespace transposed_v_copy;
    const TransposedVLayout layout(params);
    if (layout.bytes() == 0)
        return;
    const int64_t key_tiles = (layout.row_keys + TILE_KEYS - 1) / TILE_KEYS;
    const dim3 grid(static_cast<unsigned>(key_tiles * Tile<D_HEAD, TILE_KEYS>::COLUMN_TILES), params.heads_kv, params.batch);
    transpose_v_kernel<D_HEAD, TILE_KEYS><<<grid, THREADS, 0, stream>>>(
        static_cast<const uint8_t *>(params.v), params.v_strides, params.seqlen_k, params.d_head,
        static_cast<uint8_t *>(out), layout.strides(), layout.row_keys);
    check_cuda(cudaGetLastError(), "launching V's transposed copy");
}

} // namespace flash::sm90
