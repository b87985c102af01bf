// Constants shared by every kernel header: warp size, the MMA instruction's shape and copy widths.
#pragma once

#include "common/dtype.h"

namespace flash {

constexpr int WARP_SIZE = 32;

// mma.sync.aligned.m16n8k16: one warp multiplies a 16x16 A tile by a 16x8 B tile.
constexpr int MMA_M = 16;
constexpr int MMA_N = 8;
constexpr int MMA_K = 16;

// Global<->shared copies move 16 bytes per thread per instruction (cp.async.cg's only size, and
// the widest vector load/store), i.e. 8 half-precision elements.
constexpr int COPY_BYTES = 16;
constexpr int ELEMS_PER_COPY = COPY_BYTES / ELEMENT_BYTES;

// log2(e): exp(x) = 2^(x * log2(e)); and ln(2).
constexpr float LOG2_E = 1.4426950408889634f;
constexpr float LN_2 = 0.6931471805599453f;

// Every lane of a warp takes part in the warp-wide shuffles and votes.
constexpr unsigned FULL_WARP_MASK = 0xffffffffu;

// Threads of a quad (lane / 4) share the rows of an MMA accumulator fragment.
constexpr int QUAD_SIZE = 4;

} // namespace flash
