// A varlen call's K and V tensor maps bounded at one sequence's end. The call's maps
// (KernelParams::k and v) span every sequence's rows, so the last KV tile of a sequence whose length
// is not a whole number of tiles would read the rows after it: the next sequence's, or padding that
// may hold anything. The mask keeps those rows out of the scores but not out of P V, where a zero
// probability times a NaN or an infinity of V is NaN. So before loading such a tile, a block's
// loading thread copies both maps into slots of its own in global memory (KernelParams::sequence_maps),
// moves their rows' extent to the sequence's end, and loads the sequence's KV tiles through them:
// the copy engine then reads zeros past the end, as it does past a tensor's last row. A paged
// sequence's maps are views of the pools, whose rows' dimension is a page's (tile_loader.cuh): its
// bound maps end that dimension at the sequence's last key in its last page, and only the box on
// that page loads through them.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda.h>

#include "common/sequence.cuh"
#include "sm90/kernel_params.h"
#include "sm90/tma.cuh"

namespace flash::sm90 {

// A pair of k and v maps, v's right after k's (as in KernelParams): one pointer, as the producer
// warpgroup runs on few registers (setmaxnreg), and one copy of the call's pair.
struct KVTensorMaps {
    const CUtensorMap *pair;

    __device__ __forceinline__ const CUtensorMap *k() const { return pair; }
    __device__ __forceinline__ const CUtensorMap *v() const { return pair + 1; }
};
static_assert(offsetof(KernelParams, v) == offsetof(KernelParams, k) + sizeof(CUtensorMap),
              "KernelParams holds v's map right after k's");

// The call's maps, for the tiles that end within their sequence.
__device__ __forceinline__ KVTensorMaps call_tensor_maps(const KernelParams &kp) { return {&kp.k}; }

// One block's slots: `pairs` pairs of (k, v) maps, written in turn. A persistent block's producer
// binds a work tile's maps before its first KV load, while the loads of earlier work tiles may still
// be reading theirs; but it has waited for the release of the stage its last load went to, so at
// most `stages` tile loads are in flight, and each work tile that wrote a pair, or used the last one
// written, loads at least one tile: stages + 1 pairs are never rewritten while a load may read
// them. A single-pass block binds once.
template <typename Kernel>
struct SequenceTensorMapSlots {
    static constexpr int pairs = Kernel::persistent ? Kernel::stages + 1 : 1;
    static constexpr int64_t bytes_per_block = pairs * 2 * static_cast<int64_t>(sizeof(CUtensorMap));
};

// Binds each work tile's K and V maps; run by the block's loading thread alone. Work tiles of one
// sequence (or of sequences that end at the same row of their batch entries) share a pair, and a
// slot is copied from the call's maps only the first time it is written: later only the extent
// changes.
template <typename Kernel, bool VARLEN>
struct KVTensorMapBinder {
    using Slots = SequenceTensorMapSlots<Kernel>;
    const KernelParams &kp;
    int written = 0;     // pairs this block has written
    int last_end = -1;   // the extent of the pair written last

    // The maps through which a work tile of `sequence` loads its KV tiles [first_tile, end_tile).
    __device__ __forceinline__ KVTensorMaps bind(const Sequence<false> &, int, int) { return call_tensor_maps(kp); }
    __device__ __forceinline__ KVTensorMaps bind(const Sequence<true> &sequence, int first_tile, int end_tile) {
        const UsedRows rows = sequence.k_rows;
        if (first_tile >= end_tile || end_tile * Kernel::B_c <= rows.length)
            return call_tensor_maps(kp); // no tile it loads reaches past the sequence's end
        // The rows' dimension (tensor_maps.h) ends with the sequence: in its batch entry, or in its
        // last page (where that page is full, no box reaches past the end within it).
        const int page_size = kp.params.sequences.paged.page_size;
        const bool paged = kp.params.sequences.paged.block_table != nullptr;
        const int end = paged ? rows.length % page_size : rows.start + rows.length;
        if (paged && end == 0)
            return call_tensor_maps(kp);
        if (end != last_end) {
            CUtensorMap *const pair = slot(written);
            if (written < Slots::pairs)
                copy_pair(pair, kp);
            tensor_map_set_extent<1>(pair, end);
            tensor_map_set_extent<1>(pair + 1, end);
            tensor_map_release();
            tensor_map_acquire(pair);
            tensor_map_acquire(pair + 1);
            last_end = end;
            ++written;
        }
        return {slot(written - 1)};
    }

  private:
    __device__ __forceinline__ CUtensorMap *slot(int n) const {
        return kp.sequence_maps + 2 * (blockIdx.x * Slots::pairs + n % Slots::pairs);
    }
    // The call's k and v maps, 8 bytes at a time: the producer warpgroup runs on few registers.
    __device__ __forceinline__ static void copy_pair(CUtensorMap *to, const KernelParams &kp) {
        const uint2 *const source = reinterpret_cast<const uint2 *>(&kp.k);
        uint2 *const destination = reinterpret_cast<uint2 *>(to);
#pragma unroll 1
        for (int i = 0; i < static_cast<int>(2 * sizeof(CUtensorMap) / sizeof(uint2)); ++i)
            destination[i] = source[i];
    }
};

} // namespace flash::sm90
