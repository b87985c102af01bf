// What the Hopper kernels receive: the call's parameter block and the TMA tensor maps of q, k, v
// and o, built by the launcher for each call. Passed as one __grid_constant__ argument, so the
// maps stay in the kernel parameter space where the copy engine reads them.
#pragma once

#include <cuda.h>

#include "common/forward_params.h"

namespace flash::sm90 {

struct KernelParams {
    ForwardParams params;
    // (d_head, seq, heads, batch) views of the four tensors, in swizzled boxes of one row's columns
    // (tensor_maps.h): 64 rows for q and o (one consumer warpgroup's), B_c rows for k and v.
    CUtensorMap q;
    CUtensorMap k;
    CUtensorMap v;
    CUtensorMap o;
    // A varlen kernel's slots for k and v maps bounded at a sequence's end (ForwardParams::scratch,
    // sequence_tensor_maps.cuh); unused by the others.
    CUtensorMap *sequence_maps;
    // With a paged cache, k's and v's maps are (d_head, page_size, heads_kv, num_pages) views of the
    // pools, in boxes of this many rows: the most that divides both a page and a block's share of a
    // KV tile (KV_slice_rows), so no box straddles two pages (tile_loader.cuh).
    int page_box_rows;
};

} // namespace flash::sm90
