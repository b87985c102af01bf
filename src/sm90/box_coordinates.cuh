// Where one sequence's boxes lie in a tensor map (tensor_maps.h), for the copies of Q, K and V in and
// O out: a dense call's 4-dimensional maps take (column, row, head, batch); a varlen call's
// 5-dimensional ones take the row twice, so that their bounds stop at the sequence's end.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "common/sequence.cuh"
#include "sm90/tma.cuh"

namespace flash::sm90 {

template <bool VARLEN>
struct BoxCoordinates;

template <>
struct BoxCoordinates<false> {
    int batch;

    __device__ __forceinline__ void load(void *dst, const CUtensorMap *map, uint64_t *barrier, int column, int row,
                                         int head) const {
        tma_load_4d(dst, map, barrier, column, row, head, batch);
    }
    __device__ __forceinline__ void load_multicast(void *dst, const CUtensorMap *map, uint64_t *barrier, uint16_t cta_mask,
                                                   int column, int row, int head) const {
        tma_load_4d_multicast(dst, map, barrier, cta_mask, column, row, head, batch);
    }
    __device__ __forceinline__ void store(const CUtensorMap *map, const void *src, int column, int row, int head) const {
        tma_store_4d(map, src, column, row, head, batch);
    }
};

// Row r of a sequence whose used rows are start .. start + length - 1 of a tensor with `rows` rows
// is at (column, rows - length + r, start + length, head, batch).
template <>
struct BoxCoordinates<true> {
    int row_offset; // rows - length
    int placement;  // start + length
    int batch;

    __device__ __forceinline__ void load(void *dst, const CUtensorMap *map, uint64_t *barrier, int column, int row,
                                         int head) const {
        tma_load_5d(dst, map, barrier, column, row_offset + row, placement, head, batch);
    }
    __device__ __forceinline__ void load_multicast(void *dst, const CUtensorMap *map, uint64_t *barrier, uint16_t cta_mask,
                                                   int column, int row, int head) const {
        tma_load_5d_multicast(dst, map, barrier, cta_mask, column, row_offset + row, placement, head, batch);
    }
    __device__ __forceinline__ void store(const CUtensorMap *map, const void *src, int column, int row, int head) const {
        tma_store_5d(map, src, column, row_offset + row, placement, head, batch);
    }
};

// The boxes of a sequence's q and o rows, and of its k and v rows.
__device__ __forceinline__ BoxCoordinates<false> q_boxes(const Sequence<false> &sequence) { return {sequence.batch}; }
__device__ __forceinline__ BoxCoordinates<false> kv_boxes(const Sequence<false> &sequence) { return {sequence.batch}; }
__device__ __forceinline__ BoxCoordinates<true> q_boxes(const Sequence<true> &sequence) {
    const UsedRows &used = sequence.q_rows;
    return {sequence.params.sequences.rows_q - used.length, used.start + used.length, sequence.tensor_batch_q()};
}
__device__ __forceinline__ BoxCoordinates<true> kv_boxes(const Sequence<true> &sequence) {
    const UsedRows &used = sequence.k_rows;
    return {sequence.params.sequences.rows_k - used.length, used.start + used.length, sequence.tensor_batch_k()};
}

} // namespace flash::sm90
