// V's transposed copy (sm90/transposed_v_copy.cuh) at each block size it compiles with, for
// transposed_v_copy_bench.py (compiled there at run time, sm_90a).
#include <cstdint>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "sm90/transposed_v_copy.cuh"

namespace {

using flash::ForwardParams;
using flash::sm90::TransposedVLayout;

template <int D_HEAD>
void copy_with_tile(int64_t tile_keys, const ForwardParams &params, void *out, cudaStream_t stream) {
    switch (tile_keys) {
    case 64: flash::sm90::copy_V_transposed<D_HEAD, 64>(params, out, stream); break;
    case 128: flash::sm90::copy_V_transposed<D_HEAD, 128>(params, out, stream); break;
    case 256: flash::sm90::copy_V_transposed<D_HEAD, 256>(params, out, stream); break;
    default: TORCH_CHECK(false, "tile_keys: 64, 128 or 256, got ", tile_keys);
    }
}

// v: (batch, seqlen_k, heads_kv, d_head) e4m3, its last stride 1; kernel_d_head: the configuration's
// head size (64, 128 or 256, at least v's). Returns the copy as (batch, heads_kv, d_head, row_keys) bytes.
torch::Tensor transposed_copy(const torch::Tensor &v, int64_t kernel_d_head, int64_t tile_keys) {
    TORCH_CHECK(v.is_cuda() && v.scalar_type() == torch::kFloat8_e4m3fn && v.dim() == 4 && v.stride(3) == 1,
                "v: a 4-D float8_e4m3fn CUDA tensor with unit last stride");
    TORCH_CHECK(v.size(3) % 16 == 0 && v.size(3) <= kernel_d_head, "v: d_head a multiple of 16, at most kernel_d_head");
    const c10::cuda::CUDAGuard guard(v.device());
    ForwardParams params{};
    params.v = v.data_ptr();
    params.v_strides = {v.stride(0), v.stride(1), v.stride(2)};
    params.batch = static_cast<int>(v.size(0));
    params.seqlen_k = static_cast<int>(v.size(1));
    params.heads_kv = static_cast<int>(v.size(2));
    params.d_head = static_cast<int>(v.size(3));
    const TransposedVLayout layout(params);
    torch::Tensor out = torch::empty({layout.batch, layout.heads_kv, layout.d_head, layout.row_keys}, v.options().dtype(torch::kUInt8));
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    switch (kernel_d_head) {
    case 64: copy_with_tile<64>(tile_keys, params, out.data_ptr(), stream); break;
    case 128: copy_with_tile<128>(tile_keys, params, out.data_ptr(), stream); break;
    case 256: copy_with_tile<256>(tile_keys, params, out.data_ptr(), stream); break;
    default: TORCH_CHECK(false, "kernel_d_head: 64, 128 or 256, got ", kernel_d_head);
    }
    return out;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, extension) {
    extension.def("transposed_copy", &transposed_copy, "V's transposed copy (v, kernel_d_head, tile_keys)");
    extension.attr("default_tile_keys") = flash::sm90::transposed_v_copy::TILE_KEYS;
}
