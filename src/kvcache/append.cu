// The append kernel (append_forward_kernel: its name ends as the forward kernels' do, which
// tools/sanitize.sh selects by): a block per (sequence, row) of the step, its threads over the row's
// heads and column pairs. Row i of sequence b writes new key and value row i into
// the cache (rotating the key), and rotates query row i; a step's rows are few, so a launch is the
// whole cost and one launch does both. The rotation is computed in float32 with separately rounded
// products (no fused multiply-add), as the same arithmetic on tensors is, and rounded once: to the
// 16-bit type, or for an e4m3 cache divided by the head's factor and rounded to e4m3, with no 16-bit
// rounding between.
#include <algorithm>
#include <type_traits>

#include "common/cuda_utils.cuh"
#include "common/e4m3.cuh"
#include "common/type_utils.cuh"
#include "kvcache/append.h"

namespace flash {
namespace {

constexpr int APPEND_THREADS = 128;

// Contents of the call's index tensors are not trusted: every index is clamped into its range.
__device__ __forceinline__ int clamp_index(int64_t i, int size) { return static_cast<int>(min(max(i, int64_t{0}), int64_t{size} - 1)); }

// Row `row` of batch entry `entry` of a (batch, seq, heads, d_head) tensor at `base`.
template <typename T, typename Base>
__device__ __forceinline__ T *row_of(Base *base, const TensorStrides &strides, int64_t entry, int64_t row) {
    return static_cast<T *>(base) + entry * strides.batch + row * strides.seq;
}

// A float32 value as an element of out_t: rounded to the 16-bit type; or for an e4m3 cache divided by
// the head's factor and rounded to the nearest even e4m3 value, finite values saturating at +-448
// and NaN staying NaN (cvt.rn.satfinite.e4m3x2.f32 from sm_89 on, the header's emulation before).
template <typename out_t>
__device__ __forceinline__ out_t stored(float x, float descale) {
    if constexpr (std::is_same_v<out_t, __nv_fp8_e4m3>) {
        out_t e4m3;
        e4m3.__x = __nv_cvt_float_to_fp8(__fdiv_rn(x, descale), __NV_SATFINITE, __NV_E4M3);
        return e4m3;
    } else {
        return from_float<out_t>(x);
    }
}

// A column that is not rotated: copied as it is into a row of its own type, quantised into e4m3.
template <typename out_t, typename value_t>
__device__ __forceinline__ out_t copied(value_t x, float descale) {
    if constexpr (std::is_same_v<out_t, value_t>)
        return x;
    else
        return stored<out_t>(to_float(x), descale);
}

// Row `src` (heads of d_head columns, `src_head` apart) of sequence b into row `dst`, the first
// rotary_dim columns of each head rotated by the angle of table row `angle` (-1: none). A unit is a
// pair of columns: a rotated pair, or two columns copied. An e4m3 row's head h is quantised by
// descale's factor of (b, h).
template <typename value_t, typename rotary_t, typename out_t>
__device__ void rotate_row(const AppendParams &p, const value_t *src, int64_t src_head, out_t *dst, int64_t dst_head,
                           int heads, int angle, int b, const Descale &descale) {
    const int half = angle >= 0 ? p.rotary_dim / 2 : 0;
    const int copied_pairs = (p.d_head - 2 * half + 1) / 2;
    const int units = half + copied_pairs;
    const rotary_t *cos = static_cast<const rotary_t *>(p.cos) + static_cast<int64_t>(angle) * half;
    const rotary_t *sin = static_cast<const rotary_t *>(p.sin) + static_cast<int64_t>(angle) * half;
    for (int unit = threadIdx.x; unit < heads * units; unit += APPEND_THREADS) {
        const int head = unit / units;
        const int j = unit % units;
        const value_t *from = src + head * src_head;
        out_t *to = dst + head * dst_head;
        const float factor = std::is_same_v<out_t, __nv_fp8_e4m3> ? descale_at(descale, b, head) : 1.0f;
        if (j < half) {
            const int first = p.interleaved ? 2 * j : j;
            const int second = p.interleaved ? 2 * j + 1 : j + half;
            const float x1 = to_float(from[first]), x2 = to_float(from[second]);
            const float c = to_float(cos[j]), s = to_float(sin[j]);
            to[first] = stored<out_t>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)), factor);
            to[second] = stored<out_t>(__fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c)), factor);
        } else {
            const int column = 2 * half + 2 * (j - half);
            to[column] = copied<out_t>(from[column], factor);
            if (column + 1 < p.d_head)
                to[column + 1] = copied<out_t>(from[column + 1], factor);
        }
    }
}

template <typename value_t, typename rotary_t, typename cache_t>
__global__ void __launch_bounds__(APPEND_THREADS) append_forward_kernel(const __grid_constant__ AppendParams p) {
    // One dimension for both: a long prefill's rows or a large batch may each pass the grid's y limit.
    const int rows = max(p.new_rows, p.q_rows);
    const int row = blockIdx.x % rows;
    const int b = blockIdx.x / rows;
    const int64_t start = p.seqlens[b];
    const auto angle_at = [&](int64_t position) { return p.rotary_dim > 0 ? clamp_index(position, p.rotary_rows) : -1; };
    if (row < p.new_rows) {
        const int position = clamp_index(start + row, p.capacity);
        int entry = b, entry_row = position;
        if (p.block_table != nullptr) {
            entry = clamp_index(p.block_table[b * p.block_table_stride + position / p.entry_rows], p.entries);
            entry_row = position % p.entry_rows;
        } else if (p.batch_idx != nullptr) {
            entry = clamp_index(p.batch_idx[b], p.entries);
        }
        rotate_row<value_t, rotary_t, cache_t>(p, row_of<const value_t>(p.k_new, p.k_new_strides, b, row),
                                               p.k_new_strides.head,
                                               row_of<cache_t>(p.k_cache, p.k_cache_strides, entry, entry_row),
                                               p.k_cache_strides.head, p.heads_kv, angle_at(start + row), b, p.k_descale);
        rotate_row<value_t, rotary_t, cache_t>(p, row_of<const value_t>(p.v_new, p.v_new_strides, b, row),
                                               p.v_new_strides.head,
                                               row_of<cache_t>(p.v_cache, p.v_cache_strides, entry, entry_row),
                                               p.v_cache_strides.head, p.heads_kv, -1, b, p.v_descale);
    }
    if (row < p.q_rows) {
        const value_t *q = row_of<const value_t>(p.q, p.q_strides, b, row);
        value_t *q_out = static_cast<value_t *>(p.q_out) + (static_cast<int64_t>(b) * p.q_rows + row) * p.heads_q * p.d_head;
        rotate_row<value_t, rotary_t, value_t>(p, q, p.q_strides.head, q_out, p.d_head, p.heads_q,
                                               angle_at(start + (p.q_per_token ? row : 0)), b, Descale{});
    }
}

template <typename value_t, typename cache_t>
void launch(const AppendParams &params, cudaStream_t stream) {
    const dim3 grid(std::max(params.new_rows, params.q_rows) * params.batch);
    if (params.rotary_float)
        append_forward_kernel<value_t, float, cache_t><<<grid, APPEND_THREADS, 0, stream>>>(params);
    else
        append_forward_kernel<value_t, value_t, cache_t><<<grid, APPEND_THREADS, 0, stream>>>(params);
}

template <typename value_t>
void launch(DType cache_dtype, const AppendParams &params, cudaStream_t stream) {
    if (cache_dtype == DType::E4M3)
        launch<value_t, element_t<DType::E4M3>>(params, stream);
    else
        launch<value_t, value_t>(params, stream);
}

} // namespace

void append_to_cache(DType dtype, DType cache_dtype, const AppendParams &params, cudaStream_t stream) {
    if (params.batch == 0 || std::max(params.new_rows, params.q_rows) == 0)
        return;
    if (dtype == DType::FP16)
        launch<element_t<DType::FP16>>(cache_dtype, params, stream);
    else
        launch<element_t<DType::BF16>>(cache_dtype, params, stream);
    check_cuda(cudaGetLastError(), "KV cache append launch");
}

} // namespace flash
