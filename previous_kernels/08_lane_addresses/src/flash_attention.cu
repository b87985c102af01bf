// The Python binding: validates the arguments, looks the configuration up in the generated kernel
// map and launches that kernel on the current torch stream.
#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "common.h"
#include "cuda_utils.cuh"
#include "flash_config.cuh"
#include "flash_kernels.cuh"

namespace py = pybind11;

namespace flash {
namespace {

constexpr const char *REBUILD_HINT =
    "build a set containing it: FLASH_BUILD_KERNELS=<default|prog|progall|tune|all|B_r,B_c> "
    "pip install --no-build-isolation -e .";

std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

py::object config_field(py::handle cfg, const char *field) {
    if (!py::hasattr(cfg, field))
        throw py::type_error(std::string("kernel_cfg: missing field '") + field +
                             "'; expected a FlashForwardKernelConfig");
    return cfg.attr(field);
}

int int_field(py::handle cfg, const char *field) {
    const py::object value = config_field(cfg, field);
    if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
        throw py::type_error(std::string("kernel_cfg.") + field + ": expected an int, got " + type_name(value));
    const long long v = value.cast<long long>();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
        throw py::value_error(std::string("kernel_cfg.") + field + ": " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
}

bool bool_field(py::handle cfg, const char *field) {
    const py::object value = config_field(cfg, field);
    if (!py::isinstance<py::bool_>(value))
        throw py::type_error(std::string("kernel_cfg.") + field + ": expected a bool, got " + type_name(value));
    return value.cast<bool>();
}

// Reads the 13 fields by name from any object that has them (the Python dataclass normally).
FlashForwardKernelConfig config_from_python(py::handle cfg) {
    const int dtype = int_field(cfg, "dtype");
    if (dtype != static_cast<int>(DType::FP16) && dtype != static_cast<int>(DType::BF16))
        throw py::value_error("kernel_cfg.dtype: expected FP16 (5) or BF16 (15), got " + std::to_string(dtype));
    return FlashForwardKernelConfig{static_cast<DType>(dtype),
                                    int_field(cfg, "d_head"),
                                    int_field(cfg, "B_r"),
                                    int_field(cfg, "B_c"),
                                    int_field(cfg, "n_warps"),
                                    bool_field(cfg, "async_copy"),
                                    bool_field(cfg, "eager_load_blocks"),
                                    bool_field(cfg, "swizzled"),
                                    int_field(cfg, "Q_mma_load_K_tiles"),
                                    int_field(cfg, "K_mma_load_K_tiles"),
                                    int_field(cfg, "V_mma_load_K_tiles"),
                                    bool_field(cfg, "mma_double_buffer_loads"),
                                    bool_field(cfg, "optimized_softmax")};
}

py::tuple config_to_python(const FlashForwardKernelConfig &c) {
    return py::make_tuple(static_cast<int>(c.dtype), c.d_head, c.B_r, c.B_c, c.n_warps, c.async_copy,
                          c.eager_load_blocks, c.swizzled, c.Q_mma_load_K_tiles, c.K_mma_load_K_tiles,
                          c.V_mma_load_K_tiles, c.mma_double_buffer_loads, c.optimized_softmax);
}

std::string describe(const FlashForwardKernelConfig &c) {
    const auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
    return "FlashForwardKernelConfig{" + std::string(c.dtype == DType::FP16 ? "FP16" : "BF16") + ", " +
           std::to_string(c.d_head) + ", " + std::to_string(c.B_r) + ", " + std::to_string(c.B_c) + ", " +
           std::to_string(c.n_warps) + ", " + flag(c.async_copy) + ", " + flag(c.eager_load_blocks) + ", " +
           flag(c.swizzled) + ", " + std::to_string(c.Q_mma_load_K_tiles) + ", " +
           std::to_string(c.K_mma_load_K_tiles) + ", " + std::to_string(c.V_mma_load_K_tiles) + ", " +
           flag(c.mma_double_buffer_loads) + ", " + flag(c.optimized_softmax) + "}";
}

forward_kernel_fn lookup_kernel(const FlashForwardKernelConfig &cfg) {
    const auto it = forward_kernels.find(cfg);
    if (it == forward_kernels.end())
        throw py::value_error("kernel_cfg: " + describe(cfg) + " is not compiled into this build (kernel set '" +
                              compiled_kernel_set + "'); " + REBUILD_HINT);
    return it->second;
}

// Built without iostreams: string streams inside an extension module have crashed on some
// systems whose C++ runtime differs from the one torch was built with.
std::string shape_str(const at::Tensor &t) {
    std::string text = "[";
    for (int dim = 0; dim < t.dim(); ++dim)
        text += (dim ? ", " : "") + std::to_string(t.size(dim));
    return text + "]";
}

at::Tensor tensor_argument(py::handle obj, const char *name) {
    if (!THPVariable_Check(obj.ptr()))
        throw py::type_error(std::string(name) + ": expected a torch.Tensor, got " + type_name(obj));
    return THPVariable_Unpack(obj.ptr());
}

// The rules one tensor must satisfy on its own.
void check_tensor(const at::Tensor &t, const char *name) {
    if (!t.is_cuda())
        throw py::value_error(std::string(name) + ": expected a CUDA tensor, got a tensor on " + t.device().str());
    if (t.scalar_type() != at::kHalf && t.scalar_type() != at::kBFloat16)
        throw py::type_error(std::string(name) + ": dtype must be float16 or bfloat16, got " +
                             std::string(c10::toString(t.scalar_type())));
    if (t.dim() != 4)
        throw py::value_error(std::string(name) + ": expected 4 dimensions (batch, seq, heads, d_head), got " +
                              std::to_string(t.dim()));
    if (t.size(3) > 1 && t.stride(3) != 1)
        throw py::value_error(std::string(name) + ": the last dimension (d_head) must be contiguous (stride 1), got stride " +
                              std::to_string(t.stride(3)));
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % COPY_BYTES != 0)
        throw py::value_error(std::string(name) + ": the data pointer must be 16-byte aligned");
    for (int dim = 0; dim < 3; ++dim)
        if (t.size(dim) > 1 && t.stride(dim) % ELEMS_PER_COPY != 0)
            throw py::value_error(std::string(name) + ": the batch, seq and head strides must be multiples of " +
                                  std::to_string(ELEMS_PER_COPY) + " elements (16 bytes), got strides " +
                                  std::to_string(t.stride(0)) + ", " + std::to_string(t.stride(1)) + ", " +
                                  std::to_string(t.stride(2)));
}

// The rules tying one tensor to q and to the configuration.
void check_matches_q(const at::Tensor &t, const char *name, const at::Tensor &q) {
    if (t.device() != q.device())
        throw py::value_error(std::string(name) + ": is on " + t.device().str() + " but q is on " + q.device().str() +
                              "; all tensors must be on one device");
    if (t.scalar_type() != q.scalar_type())
        throw py::type_error(std::string(name) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
                             " differs from q's " + std::string(c10::toString(q.scalar_type())));
    if (t.sizes() != q.sizes())
        throw py::value_error(std::string(name) + ": shape " + shape_str(t) + " differs from q's " + shape_str(q) +
                              "; q, k, v and o must have the same (batch, seq, heads, d_head) shape");
}

// Byte range [first, last) that a strided tensor can touch.
std::pair<uintptr_t, uintptr_t> byte_extent(const at::Tensor &t) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(t.data_ptr());
    int64_t last_offset = 0;
    for (int dim = 0; dim < t.dim(); ++dim)
        last_offset += (t.size(dim) - 1) * t.stride(dim);
    return {first, first + (last_offset + 1) * t.element_size()};
}

void check_no_overlap(const at::Tensor &o, const at::Tensor &input, const char *input_name) {
    if (o.numel() == 0 || input.numel() == 0)
        return;
    const auto [o_first, o_last] = byte_extent(o);
    const auto [in_first, in_last] = byte_extent(input);
    if (o_first < in_last && in_first < o_last)
        throw py::value_error(std::string("o: overlaps ") + input_name +
                              " in memory; the output must not share memory with an input");
}

void check_device(const at::Tensor &q, const FlashForwardKernelConfig &cfg) {
    const cudaDeviceProp *props = at::cuda::getDeviceProperties(q.device().index());
    if (props->major < 8)
        throw py::value_error("q: " + q.device().str() + " (" + props->name + ") is sm_" +
                              std::to_string(props->major * 10 + props->minor) +
                              "; the kernels need sm_80 or newer (mma.sync.m16n8k16, ldmatrix, cp.async)");
    if (static_cast<size_t>(cfg.smem_bytes()) > props->sharedMemPerBlockOptin)
        throw py::value_error("kernel_cfg: needs " + std::to_string(cfg.smem_bytes()) +
                              " bytes of shared memory per block; " + q.device().str() + " allows " +
                              std::to_string(props->sharedMemPerBlockOptin));
}

// Kernels start with a 48 KB dynamic shared-memory limit; raise it to what the config uses, once
// per (device, kernel), the first time the kernel runs there.
void ensure_smem_limit(forward_kernel_fn kernel, int smem_bytes, int device) {
    static std::mutex mutex;
    static std::set<std::pair<int, forward_kernel_fn>> raised;
    const std::lock_guard<std::mutex> lock(mutex);
    if (raised.count({device, kernel}))
        return;
    check_cuda(cudaFuncSetAttribute(reinterpret_cast<const void *>(kernel),
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes),
               "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
    raised.insert({device, kernel});
}

TensorStrides strides_of(const at::Tensor &t) { return TensorStrides{t.stride(0), t.stride(1), t.stride(2)}; }

py::tuple forward(py::handle kernel_cfg, py::handle q_obj, py::handle k_obj, py::handle v_obj, py::handle o_obj,
                  bool benchmark) {
    const FlashForwardKernelConfig cfg = config_from_python(kernel_cfg);

    const at::Tensor q = tensor_argument(q_obj, "q");
    const at::Tensor k = tensor_argument(k_obj, "k");
    const at::Tensor v = tensor_argument(v_obj, "v");
    check_tensor(q, "q");
    check_tensor(k, "k");
    check_tensor(v, "v");
    check_matches_q(k, "k", q);
    check_matches_q(v, "v", q);
    const at::ScalarType cfg_dtype = cfg.dtype == DType::FP16 ? at::kHalf : at::kBFloat16;
    if (q.scalar_type() != cfg_dtype)
        throw py::type_error("q: dtype " + std::string(c10::toString(q.scalar_type())) +
                             " does not match kernel_cfg.dtype (" + std::string(c10::toString(cfg_dtype)) + ")");

    const int64_t batch = q.size(0), seq_len = q.size(1), n_heads = q.size(2), d_head = q.size(3);
    if (d_head != cfg.d_head)
        throw py::value_error("q: d_head (last dimension) is " + std::to_string(d_head) + " but kernel_cfg.d_head is " +
                              std::to_string(cfg.d_head));
    if (seq_len % cfg.B_r != 0 || seq_len % cfg.B_c != 0)
        throw py::value_error("q: seq_len " + std::to_string(seq_len) + " must be a multiple of kernel_cfg.B_r (" +
                              std::to_string(cfg.B_r) + ") and kernel_cfg.B_c (" + std::to_string(cfg.B_c) + ")");
    if (seq_len > std::numeric_limits<int>::max())
        throw py::value_error("q: seq_len " + std::to_string(seq_len) + " exceeds 2^31 - 1");
    if (n_heads > 65535 || batch > 65535)
        throw py::value_error("q: batch and heads must each be at most 65535 (CUDA grid limits), got batch " +
                              std::to_string(batch) + ", heads " + std::to_string(n_heads));

    at::Tensor o;
    if (o_obj.is_none()) {
        const c10::cuda::CUDAGuard guard(q.device());
        o = at::empty(q.sizes(), q.options());
    } else {
        o = tensor_argument(o_obj, "o");
        check_tensor(o, "o");
        check_matches_q(o, "o", q);
        check_no_overlap(o, q, "q");
        check_no_overlap(o, k, "k");
        check_no_overlap(o, v, "v");
    }

    const forward_kernel_fn kernel = lookup_kernel(cfg);
    check_device(q, cfg);
    if (batch == 0 || seq_len == 0 || n_heads == 0)
        return py::make_tuple(o, benchmark ? py::object(py::float_(0.0)) : py::object(py::none()));

    const c10::cuda::CUDAGuard guard(q.device());
    const int smem_bytes = cfg.smem_bytes();
    ensure_smem_limit(kernel, smem_bytes, q.device().index());

    ForwardKernelArgs args{};
    args.Q = q.data_ptr();
    args.K = k.data_ptr();
    args.V = v.data_ptr();
    args.O = o.data_ptr();
    args.Q_strides = strides_of(q);
    args.K_strides = strides_of(k);
    args.V_strides = strides_of(v);
    args.O_strides = strides_of(o);
    args.softmax_scale = 1.0f / std::sqrt(static_cast<float>(cfg.d_head));
    args.seq_len = static_cast<int>(seq_len);
    args.n_heads = static_cast<int>(n_heads);
    args.n_Q_blocks = static_cast<int>(seq_len / cfg.B_r);
    args.n_KV_blocks = static_cast<int>(seq_len / cfg.B_c);

    const dim3 grid(args.n_Q_blocks, static_cast<unsigned>(n_heads), static_cast<unsigned>(batch));
    const dim3 block(cfg.n_warps * WARP_SIZE);
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();

    if (!benchmark) {
        kernel<<<grid, block, smem_bytes, stream>>>(args);
        check_cuda(cudaGetLastError(), "kernel launch");
        return py::make_tuple(o, py::none());
    }
    EventTimer timer(stream);
    timer.start();
    kernel<<<grid, block, smem_bytes, stream>>>(args);
    check_cuda(cudaGetLastError(), "kernel launch");
    timer.stop();
    return py::make_tuple(o, timer.elapsed_ms());
}

py::list compiled_configs() {
    py::list configs;
    for (const auto &[cfg, kernel] : forward_kernels)
        configs.append(config_to_python(cfg));
    return configs;
}

py::dict kernel_attributes(py::handle kernel_cfg) {
    const FlashForwardKernelConfig cfg = config_from_python(kernel_cfg);
    cudaFuncAttributes attributes{};
    check_cuda(cudaFuncGetAttributes(&attributes, reinterpret_cast<const void *>(lookup_kernel(cfg))),
               "cudaFuncGetAttributes");
    py::dict result;
    result["registers"] = attributes.numRegs;
    result["local_bytes"] = attributes.localSizeBytes;
    result["static_smem_bytes"] = attributes.sharedSizeBytes;
    result["dynamic_smem_bytes"] = cfg.smem_bytes();
    result["max_threads_per_block"] = attributes.maxThreadsPerBlock;
    return result;
}

} // namespace
} // namespace flash

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.doc() = "FlashAttention-2 forward kernels on SM80 tensor-core instructions, one per compiled configuration.";
    m.def("forward", &flash::forward, py::arg("kernel_cfg"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("o") = py::none(), py::arg("benchmark") = false,
          "forward(kernel_cfg, q, k, v, o=None, benchmark=False) -> (o, runtime_ms or None)\n\n"
          "Attention over (batch, seq, heads, d_head) CUDA tensors with the kernel compiled for kernel_cfg, "
          "launched on the current stream; with benchmark=True also returns its run time in milliseconds.");
    m.def("compiled_configs", &flash::compiled_configs,
          "The compiled configurations as 13-tuples, in the kernel map's order.");
    m.def("compiled_kernel_set", [] { return std::string(flash::compiled_kernel_set); },
          "The name of the kernel set this module was built with (FLASH_BUILD_KERNELS).");
    m.def("kernel_attributes", &flash::kernel_attributes, py::arg("kernel_cfg"),
          "Registers, local (spill) bytes, static and dynamic shared memory of a compiled kernel.");
}
