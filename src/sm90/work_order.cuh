// The order of a problem's work tiles, shared by the dense numbering (tile_scheduler.cuh) and a
// varlen call's plan (varlen_work_plan.cu). A work tile is a position (a query block, or a
// cluster's group of them) of a unit (a head of one sequence, or a cluster's heads). Without a
// mask every position of a unit costs the same: a unit's positions are numbered consecutively, so
// the blocks running at once share that unit's K and V in L2. Under a mask the positions differ in
// length (with the causal mask the last query blocks see the most keys): the units go in chunks of
// as many as keep their K and V in WORK_CHUNK_KV_BYTES, and inside a chunk every unit's longest
// position comes first, then every unit's next. So the last work tiles of a chunk (and of the grid)
// are its shortest and the blocks end together; and the blocks running at once run the same
// position, the same code (a mix of positions, as unit after unit gives, stalls the consumers on
// instruction fetch: benchmarks/HISTORY.md #2026-12-02-varlen-work-order).
#pragma once

#include <cstdint>

#include "common/common.h"

namespace flash::sm90 {

// The K and V bytes whose L2 residency a masked problem's order plans for: the heads whose work
// tiles run at once (a chunk) keep their K and V in a third of the H100's and H200's 50 MB.
constexpr int64_t WORK_CHUNK_KV_BYTES = 16 << 20;

// How many units fit WORK_CHUNK_KV_BYTES (at least one): a unit of heads_per_unit query heads over
// `keys` keys reads heads_per_unit / group key/value heads' K and V (a group's query heads are
// consecutive), KV_row_bytes per key each.
__host__ __device__ __forceinline__ int units_sharing_kv(int64_t keys, int KV_row_bytes, int heads_per_unit, int group) {
    const int64_t unit_bytes = max(int64_t{1}, keys * KV_row_bytes * heads_per_unit / group);
    return static_cast<int>(max(int64_t{1}, WORK_CHUNK_KV_BYTES / unit_bytes));
}

struct OrderedWork {
    int unit;
    int position;
};

// The work tile numbered `index` of `units` units of `positions` positions each, in chunks of
// chunk_units units where `masked` (chunk_units is not read otherwise).
__host__ __device__ __forceinline__ OrderedWork ordered_work(int index, int units, int positions, int chunk_units,
                                                             bool masked) {
    if (!masked)
        return {index / positions, index % positions};
    const int chunk = index / (chunk_units * positions);
    const int in_chunk = index - chunk * chunk_units * positions;
    const int chunk_size = min(chunk_units, units - chunk * chunk_units); // the last chunk may be smaller
    return {chunk * chunk_units + in_chunk % chunk_size, positions - 1 - in_chunk / chunk_size};
}

} // namespace flash::sm90
