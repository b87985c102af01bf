// The walk over a query block's KV tiles that both families share: the runs of KVTileRange in
// order, each compiled once for masked and once for unmasked tiles, so the unmasked tiles in
// between run exactly the code of an unmasked problem.
#pragma once

#include <type_traits>

#include "common/common.h"

namespace flash {

using MaskedTiles = std::true_type;
using UnmaskedTiles = std::false_type;

// first_tile(tile, masked) visits the first tile on its own when peel_first (its softmax update
// only sets the maxima); run(first, last, masked) visits the tiles [first, last), all masked or
// all unmasked: the masked prefix, the unmasked run, the masked suffix.
template <bool peel_first, typename Tiles, typename FirstTile, typename Run>
__device__ __forceinline__ void walk_kv_tiles(const Tiles &tiles, FirstTile &&first_tile, Run &&run) {
    int next_tile = tiles.begin;
    if constexpr (peel_first) {
        if (tiles.is_masked(tiles.begin))
            first_tile(tiles.begin, MaskedTiles{});
        else
            first_tile(tiles.begin, UnmaskedTiles{});
        ++next_tile;
    }
    if constexpr (Tiles::has_masked_prefix) {
        run(next_tile, tiles.unmasked_begin, MaskedTiles{});
        next_tile = max(next_tile, tiles.unmasked_begin);
    }
    if constexpr (Tiles::has_masked_suffix) {
        run(next_tile, tiles.unmasked_end, UnmaskedTiles{});
        run(max(next_tile, tiles.unmasked_end), tiles.end, MaskedTiles{});
    } else {
        run(next_tile, tiles.end, UnmaskedTiles{});
    }
}

} // namespace flash
