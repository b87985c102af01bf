// Where one sequence's boxes lie in a tensor map (tensor_maps.h), for the copies of Q, K and V in and
// O out: a dense call's rows are those of its batch entry; a varlen call's start at the sequence's
// first row, and with cu_seqlens all sequences are in the one batch entry; a paged sequence's keys
// are on the pages its row of the block table lists.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/sequence.cuh"
#include "sm90/tma.cuh"

namespace flash::sm90 {

struct BoxCoordinates {
    int first_row; // the sequence's, in its batch entry
    int batch;

    __device__ __forceinline__ void load(void *dst, const CUtensorMap *map, uint64_t *barrier, int column, int row,
                                         int head) const {
        tma_load_4d(dst, map, barrier, column, first_row + row, head, batch);
    }
    __device__ __forceinline__ void load_multicast(void *dst, const CUtensorMap *map, uint64_t *barrier, uint16_t cta_mask,
                                                   int column, int row, int head) const {
        tma_load_4d_multicast(dst, map, barrier, cta_mask, column, first_row + row, head, batch);
    }
    __device__ __forceinline__ void store(const CUtensorMap *map, const void *src, int column, int row, int head) const {
        tma_store_4d(map, src, column, first_row + row, head, batch);
    }
};

// A sequence's keys in a paged cache: its row of the block table and how many keys it has
// (paged_rows in common/sequence.cuh); a null table where its keys are rows of k and v.
struct KVPages {
    const int *table;
    int keys;
};

__device__ __forceinline__ KVPages kv_pages(const Sequence<false> &) { return {nullptr, 0}; }
__device__ __forceinline__ KVPages kv_pages(const Sequence<true> &sequence) {
    const PagedKV &paged = sequence.params.sequences.paged;
    if (paged.block_table == nullptr)
        return {nullptr, 0};
    return {page_table_row(paged, sequence.batch), sequence.k_rows.length};
}

// The boxes of a sequence's q and o rows, and of its k and v rows.
__device__ __forceinline__ BoxCoordinates q_boxes(const Sequence<false> &sequence) { return {0, sequence.batch}; }
__device__ __forceinline__ BoxCoordinates kv_boxes(const Sequence<false> &sequence) { return {0, sequence.batch}; }
__device__ __forceinline__ BoxCoordinates q_boxes(const Sequence<true> &sequence) {
    return {sequence.q_rows.start, sequence.tensor_batch_q()};
}
__device__ __forceinline__ BoxCoordinates kv_boxes(const Sequence<true> &sequence) {
    return {sequence.k_rows.start, sequence.tensor_batch_k()};
}

} // namespace flash::sm90
