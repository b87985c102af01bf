// The entry points: the Python module (one forward call, the configuration named or chosen from the
// dispatch tables; the choice alone, choose_config's; a KV cache step's append; what the build
// compiled) and the torch operators flash_attention::forward, forward_out and append_to_cache,
// registered here with the dispatcher so that traced and compiled code calls them without Python.
// Each decodes its arguments and runs binding/forward.h's call (or kvcache_append.h's). They hold no kernel code and no launch geometry: those are the families'.
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include <torch/extension.h>

#include <mutex>
#include <unordered_map>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "binding/arguments.h"
#include "binding/dispatch.h"
#include "binding/families.h"
#include "binding/forward.h"
#include "binding/fp8.h"
#include "binding/kvcache_append.h"
#include "binding/problem.h"
#include "binding/varlen_work_plan.h"
#include "common/cuda_utils.cuh"
#include "generated/kernel_registry.h"

namespace py = pybind11;

namespace flash::binding {
namespace {

py::object optional(bool present, py::object value) { return present ? std::move(value) : py::none(); }

py::tuple variant_to_python(const ProblemVariant &variant) {
    return py::make_tuple(static_cast<int>(variant.mask), variant.masked_tails, variant.score_mods, variant.varlen,
                          variant.kv_e4m3);
}

// The inverse of variant_to_python, for a tuple (mask, masked_tails, score_mods, varlen, kv_e4m3).
ProblemVariant variant_from_python(py::handle variant) {
    const auto [mask, masked_tails, score_mods, varlen, kv_e4m3] = variant.cast<std::tuple<int, bool, bool, bool, bool>>();
    return ProblemVariant{static_cast<MaskKind>(mask), masked_tails, score_mods, varlen, kv_e4m3};
}

// The Python function: (o, lse or None, runtime_ms or None).
py::tuple forward(py::handle kernel_cfg, py::handle q, py::handle k, py::handle v, py::handle o, bool benchmark,
                  bool causal, py::handle softmax_scale, py::handle window_size, py::handle softcap,
                  py::handle alibi_slopes, bool return_lse, bool heads_first, py::handle cu_seqlens_q,
                  py::handle cu_seqlens_k, py::handle max_seqlen_q, py::handle max_seqlen_k, py::handle seqused_q,
                  py::handle seqused_k, py::handle leftpad_q, py::handle leftpad_k, py::handle kv_batch_idx,
                  py::handle block_table, py::handle num_splits, py::handle q_descale, py::handle k_descale,
                  py::handle v_descale, py::handle out_dtype) {
    // The configuration and the other arguments first: a bad one is named whatever the tensors are.
    const std::optional<AnyConfig> named = kernel_cfg.is_none() ? std::nullopt : std::optional(config_from_python(kernel_cfg));
    const int splits = num_splits_argument(num_splits, named.has_value());
    const ProblemArguments args = problem_arguments(causal, softmax_scale, window_size, softcap, alibi_slopes);
    const SequenceArguments sequences = sequence_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                                           seqused_k, leftpad_q, leftpad_k, kv_batch_idx, block_table);
    const Fp8Arguments fp8 = fp8_arguments(q_descale, k_descale, v_descale, out_dtype);
    const std::optional<at::Tensor> o_given = optional_tensor(o, "o");
    const ForwardResult result = run_forward(named, tensor_argument(q, "q"), tensor_argument(k, "k"), tensor_argument(v, "v"),
                                             o_given, args, sequences, fp8, return_lse, benchmark, heads_first, splits);
    return py::make_tuple(result.o, optional(return_lse, py::cast(result.lse)),
                          optional(benchmark, py::float_(result.runtime_ms.value_or(0.0f))));
}

// The automatic choice for a problem, without running it: (family, configuration fields, (mask
// kind, masked tails, score mods, varlen), place in the table entry or 0, the entry's length or 0,
// the entry's ranked count or 0, why the rule chose (RuleReason), whether it is in the default
// set, the splits over the keys (0 where multiprocessors is 0: unknown)). It decides as run_forward
// does: grouped heads of a single query packed, then for a decode-shaped call the splitting
// configuration and its splits (at this many multiprocessors), else the table's configuration. q, k and the sequence
// tensors may be on any device (the meta device too); the GPU is named by its compute capability
// (major * 10 + minor) and a block's opt-in shared memory.
py::tuple choose_kernel(py::handle q_obj, py::handle k_obj, bool causal, py::handle window_size, py::handle softcap,
                        py::handle alibi_slopes, int capability, int64_t smem_per_block, py::handle cu_seqlens_q,
                        py::handle cu_seqlens_k, py::handle max_seqlen_q, py::handle max_seqlen_k, py::handle seqused_q,
                        py::handle seqused_k, py::handle leftpad_q, py::handle leftpad_k, py::handle kv_batch_idx,
                        py::handle block_table, int multiprocessors) {
    ProblemArguments args = problem_arguments(causal, py::none(), window_size, softcap, alibi_slopes);
    const SequenceArguments sequences = sequence_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q,
                                                           seqused_k, leftpad_q, leftpad_k, kv_batch_idx, block_table);
    check_sequence_arguments(sequences, false);
    at::Tensor q = tensor_argument(q_obj, "q");
    at::Tensor k = tensor_argument(k_obj, "k");
    at::Tensor v = k;
    to_batch_layout(sequences, q, k, v);
    const GroupedQueryPacking packing(q, k, v, std::nullopt, args, sequences);
    if (packing.active())
        args = packing.arguments(args);
    ForwardParams params{};
    const Problem problem = checked_problem(q, k, v, args, sequences, false, params);
    if (packing.active())
        packing.pack_params(params);
    const Gpu gpu{capability, smem_per_block};
    // Without a multiprocessor count no split is predicted, and the count reported is 0 (unknown).
    const AutomaticChoice automatic =
        automatic_choice(dtype_of(q), params, problem, gpu, multiprocessors > 0 ? 0 : 1, multiprocessors);
    const Choice &choice = automatic.choice;
    const int num_splits = multiprocessors == 0 ? 0 : automatic.num_splits;
    const TableEntry *entry = choice.entry;
    return py::make_tuple(config_to_python(choice.config),
                          variant_to_python(choice.variant),
                          choice.place, entry ? entry->seq_len : 0, entry ? static_cast<int>(entry->ranked.size()) : 0,
                          static_cast<int>(choice.rule), choice.is_default, num_splits);
}

// Takes the dispatch tables and the default set from Python, replacing any earlier ones: tables is
// a list of (capability, entries), each entry (dtype code, d_head, causal, seq_len, [(configuration,
// time_ms), ...] fastest first); defaults a list of configurations.
void load_dispatch_tables(py::list tables, py::list defaults) {
    DispatchTables loaded;
    for (py::handle table : tables) {
        const auto [capability, entries] = table.cast<std::pair<int, py::list>>();
        for (py::handle item : entries) {
            const auto [dtype, d_head, causal, seq_len, ranked] = item.cast<std::tuple<int, int, bool, int, py::list>>();
            TableEntry entry{static_cast<DType>(dtype), d_head, causal, seq_len, {}};
            for (py::handle pair : ranked)
                entry.ranked.push_back({config_from_python(pair[py::int_(0)]), pair[py::int_(1)].cast<double>()});
            loaded.entries[capability].push_back(std::move(entry));
        }
    }
    for (py::handle config : defaults)
        loaded.defaults.insert(config_from_python(config));
    DispatchTables::instance() = std::move(loaded);
}

// The tiles a configuration of B_r x B_c blocks visits for one (batch, head), as the automatic
// choice counts them (exposed so the tests compare it with the Python tools' count).
int64_t visited_tiles_of(int B_r, int B_c, int seqlen_q, int seqlen_k, bool causal, py::handle window_size) {
    MaskParams mask{};
    set_window(mask, causal, window_argument(window_size), seqlen_q, seqlen_k);
    return visited_tiles(B_r, B_c, seqlen_q, seqlen_k, mask);
}

// (family name, configuration fields, (mask kind, masked tails, score mods, varlen)) of every compiled
// kernel, in the registries' order.
py::list compiled_kernels() {
    py::list kernels;
    for_each_family([&](auto family) {
        using Family = decltype(family);
        for (const auto &[key, launcher] : Family::kernels()) {
            const auto &[cfg, variant] = key;
            kernels.append(py::make_tuple(Family::name, Family::to_python(cfg), variant_to_python(variant)));
        }
    });
    return kernels;
}

// Attributes of the kernel compiled for kernel_cfg and `variant` (variant_to_python's tuple), or for
// its first problem variant where `variant` is None. A configuration's variants differ in registers
// and, for an FP8 cache's, in shared memory.
py::dict kernel_attributes(py::handle kernel_cfg, py::handle variant) {
    py::dict result;
    visit_config(config_from_python(kernel_cfg), [&](auto family, const auto &cfg) {
        using Family = decltype(family);
        if (!Family::is_compiled(cfg))
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled into this build (kernel set '" +
                                  compiled_kernel_set + "'); " + rebuild_hint);
        const auto &kernels = Family::kernels();
        const auto found =
            variant.is_none() ? kernels.lower_bound({cfg, ProblemVariant{}}) : kernels.find({cfg, variant_from_python(variant)});
        if (found == kernels.end() || found->first.first != cfg)
            throw py::value_error("variant: not compiled for " + Family::describe(cfg) + " in this build");
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
            cudaGetLastError(); // the failed query leaves no error behind for the next CUDA call
            throw py::value_error("kernel_cfg: reading a kernel's attributes needs a CUDA GPU, and none is visible");
        }
        const auto &launcher = found->second;
        cudaFuncAttributes attributes{};
        check_cuda(cudaFuncGetAttributes(&attributes, launcher.kernel), "cudaFuncGetAttributes");
        result["registers"] = attributes.numRegs;
        result["local_bytes"] = attributes.localSizeBytes;
        result["static_smem_bytes"] = attributes.sharedSizeBytes;
        result["dynamic_smem_bytes"] = launcher.smem_bytes;
        result["producer_registers"] = launcher.producer_registers;
        result["consumer_registers"] = launcher.consumer_registers;
        result["max_threads_per_block"] = attributes.maxThreadsPerBlock;
    });
    return result;
}


// ---------------------------------------------------------------------------------------------
// The torch operators. Their schema types the arguments; config is a configuration's short form,
// or "" for the automatic choice; without return_lse, lse is an empty tensor (an operator's outputs
// cannot be optional). The fake implementations (for tracing) are Python's, in flash_attention.ops.

// Raised where autograd would need the backward pass there is not yet.
constexpr const char *MISSING_BACKWARD =
    "flash_attention has no backward pass yet, and an input (q, k, v, alibi_slopes or a descale) requires grad with "
    "grad mode on: "
    "run the forward under torch.no_grad() or torch.inference_mode(), or pass detached tensors";

// The configuration of a short form: parsed and checked once per string by Python
// (flash_attention.kernels.cached_config, whose messages name what is wrong), then kept here.
std::optional<AnyConfig> config_of_short_form(c10::string_view text) {
    if (text.empty())
        return std::nullopt;
    static std::mutex mutex;
    static std::unordered_map<std::string, AnyConfig> parsed;
    const std::string key(text);
    {
        const std::lock_guard<std::mutex> lock(mutex);
        if (const auto found = parsed.find(key); found != parsed.end())
            return found->second;
    }
    AnyConfig config;
    {
        const py::gil_scoped_acquire gil;
        config = config_from_python(py::module_::import("flash_attention.kernels").attr("cached_config")(key));
    }
    const std::lock_guard<std::mutex> lock(mutex);
    return parsed.emplace(key, config).first->second;
}

// The automatic choice reads the dispatch tables that Python hands over on the first automatic call;
// an operator may be that call.
void ensure_dispatch_tables() {
    static std::once_flag once;
    std::call_once(once, [] {
        const py::gil_scoped_acquire gil;
        py::module_::import("flash_attention.dispatch").attr("load_dispatch_tables")();
    });
}

// The operators' per-sequence arguments and num_splits, as their schema types them (all optional, at
// the end).
#define FLASH_SEQUENCE_PARAMETERS                                                                                   \
    const std::optional<at::Tensor> &cu_seqlens_q, const std::optional<at::Tensor> &cu_seqlens_k,                   \
        std::optional<int64_t> max_seqlen_q, std::optional<int64_t> max_seqlen_k,                                 \
        const std::optional<at::Tensor> &seqused_q, const std::optional<at::Tensor> &seqused_k,                     \
        const std::optional<at::Tensor> &leftpad_q, const std::optional<at::Tensor> &leftpad_k,                     \
        const std::optional<at::Tensor> &kv_batch_idx, const std::optional<at::Tensor> &block_table,                \
        std::optional<int64_t> num_splits
#define FLASH_SEQUENCE_ARGUMENTS                                                                                    \
    cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q, seqused_k, leftpad_q, leftpad_k, kv_batch_idx, \
        block_table
// Then e4m3 inputs' descales and the output's dtype (binding/fp8.h).
#define FLASH_FP8_PARAMETERS                                                                                        \
    const std::optional<at::Tensor> &q_descale, const std::optional<at::Tensor> &k_descale,                         \
        const std::optional<at::Tensor> &v_descale, std::optional<at::ScalarType> out_dtype
#define FLASH_FP8_ARGUMENTS q_descale, k_descale, v_descale, out_dtype

ForwardResult run_operator(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, c10::string_view config,
                           bool causal, std::optional<double> softmax_scale, at::IntArrayRef window_size, double softcap,
                           const std::optional<at::Tensor> &alibi_slopes, bool return_lse, const std::optional<at::Tensor> &o,
                           const SequenceArguments &sequences, std::optional<int64_t> num_splits, const Fp8Arguments &fp8) {
    if (window_size.size() != 2)
        throw py::type_error("window_size: expected a pair (left, right) of ints, got " + std::to_string(window_size.size()) +
                             " values");
    const ProblemArguments args =
        problem_arguments(causal, softmax_scale, make_window(window_size[0], window_size[1]), softcap, alibi_slopes);
    const std::optional<AnyConfig> named = config_of_short_form(config);
    if (!named)
        ensure_dispatch_tables();
    const int splits = num_splits ? num_splits_value(*num_splits) : default_num_splits(named.has_value());
    ForwardResult result = run_forward(named, q, k, v, o, args, sequences, fp8, return_lse, false, false, splits);
    if (!return_lse)
        result.lse = at::empty({0}, q.options().dtype(at::kFloat));
    return result;
}

std::tuple<at::Tensor, at::Tensor> forward_operator(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                    c10::string_view config, bool causal, std::optional<double> softmax_scale,
                                                    at::IntArrayRef window_size, double softcap,
                                                    const std::optional<at::Tensor> &alibi_slopes, bool return_lse,
                                                    FLASH_SEQUENCE_PARAMETERS, FLASH_FP8_PARAMETERS) {
    ForwardResult result = run_operator(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse,
                                        std::nullopt, SequenceArguments{FLASH_SEQUENCE_ARGUMENTS}, num_splits,
                                        Fp8Arguments{FLASH_FP8_ARGUMENTS});
    return {std::move(result.o), std::move(result.lse)};
}

at::Tensor forward_out_operator(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, c10::string_view config,
                                bool causal, std::optional<double> softmax_scale, at::IntArrayRef window_size,
                                double softcap, const std::optional<at::Tensor> &alibi_slopes, bool return_lse,
                                at::Tensor &o, FLASH_SEQUENCE_PARAMETERS, FLASH_FP8_PARAMETERS) {
    return run_operator(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, o,
                        SequenceArguments{FLASH_SEQUENCE_ARGUMENTS}, num_splits, Fp8Arguments{FLASH_FP8_ARGUMENTS})
        .lse;
}

// The optional tensors: alibi_slopes and the descales.
void check_no_grad(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                   std::initializer_list<const std::optional<at::Tensor> *> optional) {
    bool needs_grad = q.requires_grad() || k.requires_grad() || v.requires_grad();
    for (const std::optional<at::Tensor> *t : optional)
        needs_grad = needs_grad || (*t && (*t)->requires_grad());
    TORCH_CHECK_NOT_IMPLEMENTED(!(at::GradMode::is_enabled() && needs_grad), MISSING_BACKWARD);
}

// The operators' autograd kernels: raise where a backward pass would be needed, rather than return
// an output cut off from the graph; otherwise run the operator below autograd (forward_out marking
// o written, as autograd's in-place kernels do).
std::tuple<at::Tensor, at::Tensor> forward_autograd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                    c10::string_view config, bool causal, std::optional<double> softmax_scale,
                                                    at::IntArrayRef window_size, double softcap,
                                                    const std::optional<at::Tensor> &alibi_slopes, bool return_lse,
                                                    FLASH_SEQUENCE_PARAMETERS, FLASH_FP8_PARAMETERS) {
    check_no_grad(q, k, v, {&alibi_slopes, &q_descale, &k_descale, &v_descale});
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("flash_attention::forward", "")
                               .typed<decltype(forward_operator)>();
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return op.call(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse,
                   FLASH_SEQUENCE_ARGUMENTS, num_splits, FLASH_FP8_ARGUMENTS);
}

at::Tensor forward_out_autograd(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, c10::string_view config,
                                bool causal, std::optional<double> softmax_scale, at::IntArrayRef window_size,
                                double softcap, const std::optional<at::Tensor> &alibi_slopes, bool return_lse,
                                at::Tensor &o, FLASH_SEQUENCE_PARAMETERS, FLASH_FP8_PARAMETERS) {
    check_no_grad(q, k, v, {&alibi_slopes, &q_descale, &k_descale, &v_descale});
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("flash_attention::forward_out", "")
                               .typed<decltype(forward_out_operator)>();
    at::Tensor lse;
    {
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        lse = op.call(q, k, v, config, causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, o,
                      FLASH_SEQUENCE_ARGUMENTS, num_splits, FLASH_FP8_ARGUMENTS);
    }
    torch::autograd::impl::bump_version(o);
    return lse;
}

#undef FLASH_SEQUENCE_PARAMETERS
#undef FLASH_SEQUENCE_ARGUMENTS
#undef FLASH_FP8_PARAMETERS
#undef FLASH_FP8_ARGUMENTS

// flash_attention::append_to_cache: k_cache and v_cache are written in place (declared so in its
// schema).
#define FLASH_APPEND_PARAMETERS                                                                                       \
    const at::Tensor &q, at::Tensor &k_cache, at::Tensor &v_cache, const std::optional<at::Tensor> &k,                 \
        const std::optional<at::Tensor> &v, const at::Tensor &cache_seqlens,                                           \
        const std::optional<at::Tensor> &cache_batch_idx, const std::optional<at::Tensor> &block_table,              \
        const std::optional<at::Tensor> &rotary_cos, const std::optional<at::Tensor> &rotary_sin,                    \
        bool rotary_interleaved, bool q_per_token, const std::optional<at::Tensor> &k_descale,                       \
        const std::optional<at::Tensor> &v_descale
#define FLASH_APPEND_ARGUMENTS                                                                                        \
    q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, rotary_sin, rotary_interleaved, \
        q_per_token, k_descale, v_descale

at::Tensor append_operator(FLASH_APPEND_PARAMETERS) { return append_to_cache(FLASH_APPEND_ARGUMENTS); }

at::Tensor append_autograd(FLASH_APPEND_PARAMETERS) {
    const bool needs_grad = q.requires_grad() || (k && k->requires_grad()) || (v && v->requires_grad()) ||
                            k_cache.requires_grad() || v_cache.requires_grad() ||
                            (k_descale && k_descale->requires_grad()) || (v_descale && v_descale->requires_grad());
    TORCH_CHECK_NOT_IMPLEMENTED(!(at::GradMode::is_enabled() && needs_grad), MISSING_BACKWARD);
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("flash_attention::append_to_cache", "")
                               .typed<decltype(append_operator)>();
    at::Tensor q_out;
    {
        const at::AutoDispatchBelowADInplaceOrView below_autograd;
        q_out = op.call(FLASH_APPEND_ARGUMENTS);
    }
    torch::autograd::impl::bump_version(k_cache);
    torch::autograd::impl::bump_version(v_cache);
    return q_out;
}

#undef FLASH_APPEND_PARAMETERS
#undef FLASH_APPEND_ARGUMENTS

} // namespace
} // namespace flash::binding

// The per-sequence arguments, num_splits, and e4m3 inputs' descales and output dtype of both
// operators, at the end of their schemas.
#define FLASH_SEQUENCE_SCHEMA                                                                                           \
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, SymInt? max_seqlen_q=None, SymInt? max_seqlen_k=None, "          \
    "Tensor? seqused_q=None, Tensor? seqused_k=None, Tensor? leftpad_q=None, Tensor? leftpad_k=None, "                   \
    "Tensor? kv_batch_idx=None, Tensor? block_table=None, int? num_splits=None, "                                         \
    "Tensor? q_descale=None, Tensor? k_descale=None, Tensor? v_descale=None, ScalarType? out_dtype=None"

TORCH_LIBRARY(flash_attention, m) {
    m.def("forward(Tensor q, Tensor k, Tensor v, str config, bool causal, float? softmax_scale, int[] window_size, "
          "float softcap, Tensor? alibi_slopes, bool return_lse, " FLASH_SEQUENCE_SCHEMA ") -> (Tensor, Tensor)");
    m.def("forward_out(Tensor q, Tensor k, Tensor v, str config, bool causal, float? softmax_scale, int[] window_size, "
          "float softcap, Tensor? alibi_slopes, bool return_lse, Tensor(a!) o, " FLASH_SEQUENCE_SCHEMA ") -> Tensor");
    m.def("append_to_cache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k, Tensor? v, Tensor cache_seqlens, "
          "Tensor? cache_batch_idx, Tensor? block_table, Tensor? rotary_cos, Tensor? rotary_sin, bool rotary_interleaved, "
          "bool q_per_token, Tensor? k_descale=None, Tensor? v_descale=None) -> Tensor");
}
#undef FLASH_SEQUENCE_SCHEMA

// CPU too, so that CPU tensors get the call's own message (q: expected a CUDA tensor).
TORCH_LIBRARY_IMPL(flash_attention, CUDA, m) {
    m.impl("forward", &flash::binding::forward_operator);
    m.impl("forward_out", &flash::binding::forward_out_operator);
    m.impl("append_to_cache", &flash::binding::append_operator);
}
TORCH_LIBRARY_IMPL(flash_attention, CPU, m) {
    m.impl("forward", &flash::binding::forward_operator);
    m.impl("forward_out", &flash::binding::forward_out_operator);
    m.impl("append_to_cache", &flash::binding::append_operator);
}
TORCH_LIBRARY_IMPL(flash_attention, Autograd, m) {
    m.impl("forward", &flash::binding::forward_autograd);
    m.impl("forward_out", &flash::binding::forward_out_autograd);
    m.impl("append_to_cache", &flash::binding::append_autograd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    namespace binding = flash::binding;
    m.doc() = "FlashAttention-2 forward kernels written from scratch, one per compiled configuration.";
    // What the calls do not implement (TORCH_CHECK_NOT_IMPLEMENTED) raises NotImplementedError here too,
    // as it does through the torch operators.
    py::register_local_exception_translator([](std::exception_ptr raised) {
        try {
            if (raised)
                std::rethrow_exception(raised);
        } catch (const c10::NotImplementedError &error) {
            PyErr_SetString(PyExc_NotImplementedError, error.what_without_backtrace());
        }
    });
    m.def("forward", &binding::forward, py::arg("kernel_cfg"), py::arg("q"), py::arg("k"), py::arg("v"),
          py::arg("o") = py::none(), py::arg("benchmark") = false, py::arg("causal") = false,
          py::arg("softmax_scale") = py::none(), py::arg("window_size") = py::make_tuple(-1, -1),
          py::arg("softcap") = 0.0, py::arg("alibi_slopes") = py::none(), py::arg("return_lse") = false,
          py::arg("heads_first") = false, py::arg("cu_seqlens_q") = py::none(), py::arg("cu_seqlens_k") = py::none(),
          py::arg("max_seqlen_q") = py::none(), py::arg("max_seqlen_k") = py::none(), py::arg("seqused_q") = py::none(),
          py::arg("seqused_k") = py::none(), py::arg("leftpad_q") = py::none(), py::arg("leftpad_k") = py::none(),
          py::arg("kv_batch_idx") = py::none(), py::arg("block_table") = py::none(), py::arg("num_splits") = py::none(),
          py::arg("q_descale") = py::none(), py::arg("k_descale") = py::none(), py::arg("v_descale") = py::none(),
          py::arg("out_dtype") = py::none(),
          "forward(kernel_cfg, q, k, v, o=None, benchmark=False, causal=False, softmax_scale=None, "
          "window_size=(-1, -1), softcap=0.0, alibi_slopes=None, return_lse=False, heads_first=False, "
          "cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, seqused_q=None, "
          "seqused_k=None, leftpad_q=None, leftpad_k=None, kv_batch_idx=None, block_table=None, num_splits=None, "
          "q_descale=None, k_descale=None, v_descale=None, out_dtype=None) -> (o, lse or None, runtime_ms or None)\n\n"
          "Attention (FlashAttention-2's semantics) with the kernel compiled for kernel_cfg (None: chosen from the "
          "dispatch tables) and the problem's variant, launched on the current stream; with benchmark=True also "
          "returns its run time in milliseconds. q, k, v and o are (batch, seq, heads, d_head), or with "
          "heads_first (batch, heads, seq, d_head), o then allocated here. With cu_seqlens_q and cu_seqlens_k "
          "(int32, batch + 1) they are (total, heads, d_head), sequence b's rows cu_seqlens[b] .. "
          "cu_seqlens[b + 1] - 1, and lse is (heads_q, total_q); seqused (int32, batch) uses that many rows of "
          "each slot, from leftpad (int32, batch) on. kv_batch_idx (int32, batch): the entry of k and v sequence b "
          "reads. block_table (int32, (batch, pages_per_sequence)): k and v are pages (num_pages, page_size, "
          "heads_kv, d_head), sequence b's key j in page block_table[b, j // page_size]. num_splits: how many blocks share each query block's keys "
          "(0: the heuristic's count; None: 1 with kernel_cfg, 0 without). float8_e4m3fn q, k and v (dense calls on "
          "sm_90 only) are dequantised by q_descale, k_descale and v_descale (float32, (batch, heads_kv); None: 1), and "
          "o is out_dtype (torch.float16 or torch.bfloat16; None: bfloat16); 16-bit inputs take neither.");
    m.def("append_to_cache", &binding::append_to_cache, py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("k"),
          py::arg("v"), py::arg("cache_seqlens"), py::arg("cache_batch_idx"), py::arg("block_table"), py::arg("rotary_cos"),
          py::arg("rotary_sin"), py::arg("rotary_interleaved"), py::arg("q_per_token"), py::arg("k_descale") = py::none(),
          py::arg("v_descale") = py::none(),
          "append_to_cache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos, "
          "rotary_sin, rotary_interleaved, q_per_token, k_descale=None, v_descale=None) -> q rotated, or an empty "
          "tensor without rotary\n\n"
          "flash_attn_with_kvcache's writes before its attention, in one kernel launch on the current stream: k and v "
          "(batch, seqlen_new, heads_kv, d) written into the caches at rows cache_seqlens[b] + i (through "
          "cache_batch_idx or block_table where given), k rotated at those positions by rotary_cos and rotary_sin "
          "((seqlen_ro, rotary_dim / 2), float32 or q's dtype), and q rotated into a new tensor at cache_seqlens[b] "
          "+ i (q_per_token) or cache_seqlens[b]. Positions, table entries and indices are clamped into the cache. "
          "The caches hold q's dtype, or both float8_e4m3fn: k and v (rotated) are then stored divided by k_descale "
          "and v_descale (float32, (batch, heads_kv); None: 1), rounded to the nearest even e4m3 value and "
          "saturated at +-448.");
    m.def("choose", &binding::choose_kernel, py::arg("q"), py::arg("k"), py::arg("causal"), py::arg("window_size"),
          py::arg("softcap"), py::arg("alibi_slopes"), py::arg("capability"), py::arg("smem_per_block"),
          py::arg("cu_seqlens_q") = py::none(), py::arg("cu_seqlens_k") = py::none(), py::arg("max_seqlen_q") = py::none(),
          py::arg("max_seqlen_k") = py::none(), py::arg("seqused_q") = py::none(), py::arg("seqused_k") = py::none(),
          py::arg("leftpad_q") = py::none(), py::arg("leftpad_k") = py::none(), py::arg("kv_batch_idx") = py::none(),
          py::arg("block_table") = py::none(), py::arg("multiprocessors") = 0,
          "The automatic choice for a problem on a GPU of this compute capability (major * 10 + minor) and shared "
          "memory per block, without running it.");
    m.def("load_dispatch_tables", &binding::load_dispatch_tables, py::arg("tables"), py::arg("defaults"),
          "Takes the dispatch tables and the default set that the automatic choice reads.");
    m.def("visited_tiles", &binding::visited_tiles_of, py::arg("B_r"), py::arg("B_c"), py::arg("seqlen_q"),
          py::arg("seqlen_k"), py::arg("causal") = false, py::arg("window_size") = py::make_tuple(-1, -1),
          "The (query block, key tile) pairs a B_r x B_c configuration visits per (batch, head).");
    m.def("varlen_work_plan", &binding::varlen_work_plan, py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"),
          py::arg("heads_q"), py::arg("heads_kv"), py::arg("B_r"), py::arg("cluster"), py::arg("masked"),
          py::arg("KV_row_bytes"),
          "The Hopper family's work plan of a varlen batch (cu_seqlens_q, cu_seqlens_k: int32 CUDA tensors of batch "
          "+ 1 offsets) for work tiles of B_r query rows in clusters of `cluster` blocks, with or without a mask, a "
          "key's K and V rows being KV_row_bytes: an int32 tensor (tiles, 8), one row per work tile in the order the "
          "attention kernel takes them: sequence, query head, the cluster's first query block, the sequence's query "
          "blocks, then the start and length of its query rows and of its key rows.");
    m.def("compiled_kernels", &binding::compiled_kernels,
          "The compiled kernels as (family, configuration fields, (mask kind, masked tails, score mods)), in the "
          "registries' order.");
    m.def("compiled_kernel_set", [] { return std::string(flash::compiled_kernel_set); },
          "The name of the kernel set this module was built with (FLASH_BUILD_KERNELS).");
    m.def("compiled_architectures", [] { return binding::compiled_architectures(); },
          "The GPU architectures this module has machine code for, as nvcc numbers them (800, 900, ...).");
    m.attr("MISSING_BACKWARD") = binding::MISSING_BACKWARD;
    m.def("kernel_attributes", &binding::kernel_attributes, py::arg("kernel_cfg"), py::arg("variant") = py::none(),
          "Registers, local (spill) bytes, static and dynamic shared memory of a compiled kernel, and the registers per "
          "thread setmaxnreg gives its producer and consumer warpgroups (0 where it moves none): kernel_cfg's for "
          "variant (mask, masked_tails, score_mods, varlen, kv_e4m3), or its first variant's.");
}
