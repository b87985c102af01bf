// One forward call, after its arguments are decoded: the checks that need the tensors, the kernel
// (named or chosen), the output and log-sum-exp, and the launch on the current stream. What the
// Python function and the torch operators of src/flash_attention.cu both run.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/dispatch.h"
#include "binding/dtypes.h"
#include "binding/families.h"
#include "binding/fp8.h"
#include "binding/grouped_query_packing.h"
#include "binding/head_padding.h"
#include "binding/problem.h"
#include "binding/sequences.h"
#include "binding/split_kv.h"
#include "binding/tensor_checks.h"
#include "common/cuda_utils.cuh"
#include "common/forward_params.h"
#include "generated/kernel_registry.h"
#include "split_kv/combine.h"

namespace flash::binding {

inline std::string describe(const ProblemVariant &variant) {
    const char *masks[] = {"no mask", "a causal mask", "a local window"};
    const std::string cache = variant.kv_e4m3 ? ", an e4m3 KV cache" : "";
    if (variant.varlen)
        return std::string(masks[static_cast<int>(variant.mask)]) + ", sequences of lengths of their own (varlen)" + cache;
    return std::string(masks[static_cast<int>(variant.mask)]) +
           (variant.masked_tails ? ", lengths that are not multiples of the block sizes" : "") +
           (variant.score_mods ? ", softcap or ALiBi" : "") + cache;
}

inline std::string arch_of(int capability) { return "sm_" + std::to_string(capability); }

// The rules a configuration named by the caller meets before any of its kernels is looked up: q's
// dtype, and a head size it holds.
inline void check_named_config(const AnyConfig &config, const at::Tensor &q, const ForwardParams &params) {
    visit_config(config, [&](auto, const auto &cfg) {
        if (q.scalar_type() != scalar_type_of(cfg.dtype))
            throw py::type_error("q: dtype " + dtype_str(q) + " does not match kernel_cfg.dtype (" + torch_name(cfg.dtype) +
                                 ")" +
                                 (is_e4m3(q) ? "; float8_e4m3fn inputs run on the Hopper family's E4M3 configurations "
                                               "(sm90(E4M3, ...), sm_90 only)"
                                             : ""));
        if (params.d_head > cfg.d_head)
            throw py::value_error("q: d_head (last dimension) is " + std::to_string(params.d_head) +
                                  ", more than kernel_cfg.d_head (" + std::to_string(cfg.d_head) + ")");
    });
}

// The rules a kernel of a named configuration meets on this GPU: its family runs there, and its
// shared memory fits.
inline void check_named_kernel_runs(const AnyConfig &config, const ForwardLauncher &launcher, const at::Tensor &q,
                                    const Gpu &gpu) {
    visit_config(config, [&](auto family, const auto &) {
        using Family = decltype(family);
        if (!Family::runs_on(gpu.capability))
            throw py::value_error("q: " + q.device().str() + " is " + arch_of(gpu.capability) + "; " +
                                  Family::cannot_run_reason(gpu.capability));
    });
    if (launcher.smem_bytes > gpu.smem_per_block)
        throw py::value_error("kernel_cfg: needs " + std::to_string(launcher.smem_bytes) +
                              " bytes of shared memory per block; " + q.device().str() + " allows " +
                              std::to_string(gpu.smem_per_block));
}

// The kernel of a configuration named by the caller, for this problem on this GPU (its rules
// checked by check_named_config first).
inline const ForwardLauncher &named_kernel(const AnyConfig &config, const at::Tensor &q, const ForwardParams &params,
                                           const Problem &problem, const Gpu &gpu) {
    const ForwardLauncher &launcher = visit_config(config, [&](auto family, const auto &cfg) -> const ForwardLauncher & {
        using Family = decltype(family);
        const ProblemVariant variant = Family::variant_for(cfg, params, problem, problem.varlen);
        if (const char *reason = Family::unserved_reason(cfg, params, problem))
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " has no kernel for this call (" + describe(variant) +
                                  ", d_head " + std::to_string(params.d_head) + "): " + reason);
        const ForwardLauncher *found = Family::find(cfg, variant);
        // A varlen kernel runs a dense call too: a configuration compiled with its varlen variants
        // alone (a decoding one) runs dense calls on them.
        if (found == nullptr && !problem.varlen)
            found = Family::find(cfg, Family::variant_for(cfg, params, problem, true));
        const std::string build = " in this build (kernel set '" + std::string(compiled_kernel_set) + "'); " + rebuild_hint;
        if (found == nullptr && Family::is_compiled(cfg))
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " has no kernel for this problem (" +
                                  describe(variant) + ")" + build);
        if (found == nullptr)
            throw py::value_error("kernel_cfg: " + Family::describe(cfg) + " is not compiled" + build);
        return *found;
    });
    check_named_kernel_runs(config, launcher, q, gpu);
    return launcher;
}

// The message of a problem that no compiled kernel runs on this GPU.
inline std::string no_kernel_message(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu) {
    std::string reasons;
    bool any_family_runs = false;
    for_each_family([&](auto family) {
        using Family = decltype(family);
        any_family_runs = any_family_runs || Family::runs_on(gpu.capability);
        if (!Family::runs_on(gpu.capability))
            reasons += "; " + Family::cannot_run_reason(gpu.capability);
    });
    std::string text = "q: no configuration compiled into this build (kernel set '" + std::string(compiled_kernel_set) +
                       "') runs " + torch_name(dtype) + " attention with d_head " + std::to_string(params.d_head) + " and " +
                       describe(ProblemVariant{problem.mask, false, problem.score_mods, problem.varlen, problem.kv_e4m3}) + " on " +
                       arch_of(gpu.capability) +
                       " (" + std::to_string(gpu.smem_per_block) + " bytes of shared memory per block)";
    return any_family_runs ? text + reasons + "; " + rebuild_hint : text + reasons;
}

inline Choice automatic_kernel(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu) {
    std::optional<Choice> choice = choose(dtype, params, problem, gpu);
    if (!choice)
        throw py::value_error(no_kernel_message(dtype, params, problem, gpu));
    return *choice;
}

// The automatic choice of a call that names no configuration, as the call runs it and
// choose_config reports it: for a decode-shaped call, the splitting configuration's varlen kernel
// with `requested` splits (0: the heuristic's count at this many multiprocessors, 1 where that is
// 0) where split_kv.h's automatic_decode takes it; otherwise the dispatch table's (automatic_kernel).
struct AutomaticChoice {
    Choice choice;
    std::optional<SplitChoice> split; // where the keys split (more than one split)
    int num_splits = 1;
};

inline AutomaticChoice automatic_choice(DType dtype, const ForwardParams &params, const Problem &problem, const Gpu &gpu,
                                        int requested, int multiprocessors) {
    if (const std::optional<int> d_head = served_d_head(dtype, params.d_head, gpu))
        if (auto decode = automatic_decode(dtype, *d_head, params, problem, gpu, requested, multiprocessors)) {
            const bool is_default = DispatchTables::instance().defaults.count(decode->config) > 0;
            const Choice choice{decode->config, decode->variant, decode->launcher, nullptr, 0, RuleReason::DECODE, is_default};
            const int num_splits = decode->num_splits;
            return {choice, num_splits > 1 ? std::move(decode) : std::nullopt, num_splits};
        }
    return {automatic_kernel(dtype, params, problem, gpu), std::nullopt, 1};
}

inline Gpu gpu_of(const at::Tensor &q) {
    const cudaDeviceProp *props = at::cuda::getDeviceProperties(q.device().index());
    return Gpu{props->major * 10 + props->minor, static_cast<int64_t>(props->sharedMemPerBlockOptin)};
}

// q, k and v (in the batch layout) checked, and the parameter block's problem side decoded from
// them and the arguments.
inline Problem checked_problem(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v, const ProblemArguments &args,
                               const SequenceArguments &sequences, bool on_device, ForwardParams &params) {
    check_tensor(q, "q", on_device);
    check_tensor(k, "k", on_device);
    check_tensor(v, "v", on_device);
    check_kv_dtypes(q, k, v);
    check_shapes(q, k, v, sequences.kv_batches_indexed());
    return decode_problem(args, sequences, q, k, on_device, params);
}

struct ForwardResult {
    at::Tensor o;
    at::Tensor lse;                      // undefined without return_lse
    std::optional<float> runtime_ms;     // with benchmark, where a kernel ran
};

// With heads_first, q, k, v and the output are (batch, heads, seq, d_head) (SDPA's layout; o must
// not be given): the kernels read them through their strides as (batch, seq, heads, d_head) views.
// With cu_seqlens they are (total, heads, d_head), seen as one batch entry, and lse is
// (heads_q, total_q). num_splits: how many blocks share each query block's keys (split_kv.h): 0
// lets the heuristic decide, 1 runs every call whole. fp8: e4m3 inputs' descales and the output's
// dtype (fp8.h).
inline ForwardResult run_forward(const std::optional<AnyConfig> &named, at::Tensor q, at::Tensor k, at::Tensor v,
                                 std::optional<at::Tensor> o_given, const ProblemArguments &args,
                                 const SequenceArguments &sequences, const Fp8Arguments &fp8, bool return_lse,
                                 bool benchmark, bool heads_first, int num_splits) {
    check_sequence_arguments(sequences, heads_first);
    to_batch_layout(sequences, q, k, v);
    if (o_given && sequences.packed()) {
        if (o_given->dim() != 3)
            throw py::value_error("o: expected 3 dimensions (total_q, heads_q, d_head) with cu_seqlens, got " +
                                  std::to_string(o_given->dim()));
        o_given = o_given->unsqueeze(0);
    }
    if (heads_first) {
        if (o_given)
            throw py::value_error("o: must be None with heads_first (the output is allocated in that layout)");
        for (at::Tensor *t : {&q, &k, &v})
            if (t->dim() == 4)
                *t = t->transpose(1, 2);
    }
    // A head size that is not a multiple of 8 runs on copies of q, k and v padded with zero columns
    // (HeadPadding), with the call's softmax scale; the kernels read every other size in place.
    ProblemArguments problem_args = args;
    // Decoding with grouped heads runs packed (GroupedQueryPacking): checked in the call's layout,
    // with o allocated in it first (o_call), so that a kernel reading grouped rows writes it in place
    // (of q's dtype: e4m3 calls are not packed).
    const GroupedQueryPacking packing(q, k, v, o_given, args, sequences);
    std::optional<at::Tensor> o_call;
    if (packing.active()) {
        o_call = o_given ? *o_given
                 : heads_first ? at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, q.options()).transpose(1, 2)
                               : at::empty(q.sizes(), q.options());
        o_given = o_call;
        problem_args = packing.arguments(problem_args);
    }
    HeadPadding padding(q);
    if (!problem_args.softmax_scale && padding.call_d_head > 0)
        problem_args.softmax_scale = 1.0f / std::sqrt(static_cast<float>(padding.call_d_head));
    // (Of an FP8 cache's e4m3 k and v where they are wider than q's.)
    const int64_t copy_elements = std::max(elements_per_copy(q), elements_per_copy(k));
    if (padding.call_d_head % copy_elements != 0)
        padding.pad(q, k, v, (padding.call_d_head + copy_elements - 1) / copy_elements * copy_elements);
    ForwardParams params{};
    const Problem problem = checked_problem(q, k, v, problem_args, sequences, true, params);
    if (packing.active())
        packing.pack_params(params);
    const at::ScalarType o_dtype = output_dtype(q, fp8.out_dtype);
    if (o_given)
        check_output_dtype(*o_given, o_dtype, q);
    const at::TensorOptions o_options = q.options().dtype(o_dtype);
    params.q_dtype = dtype_of(q);
    params.kv_dtype = dtype_of(k);
    params.o_dtype = dtype_of(o_dtype);
    set_descales(fp8, q, k, v, params);
    const Gpu gpu = gpu_of(q);
    if (named)
        check_named_config(*named, q, params);

    const c10::cuda::CUDAGuard guard(q.device());
    // The split over the keys, where the heuristic or the caller asks for one: it runs the
    // configuration's varlen kernel (a decoding configuration has no other); else the call's own.
    std::optional<SplitChoice> split;
    const ForwardLauncher *launcher = nullptr;
    if (named) {
        if (num_splits != 1) {
            split = visit_config(*named, [&](auto family, const auto &cfg) {
                using Family = decltype(family);
                if (num_splits > 1 && !Family::splits_keys)
                    throw py::value_error("num_splits: " + Family::describe(cfg) +
                                          " does not split the keys (only the SM80 family's kernels do); pass 0 or 1");
                auto choice = split_with<Family>(cfg, params, problem, num_splits, multiprocessor_count());
                if (num_splits > 1 && !choice && Family::splits_keys && params.seqlen_k > cfg.B_c)
                    throw py::value_error("num_splits: " + Family::describe(cfg) + " has no varlen kernel for this problem (" +
                                          describe(Family::variant_for(cfg, params, problem, true)) +
                                          "), which splits run on in this build (kernel set '" +
                                          std::string(compiled_kernel_set) + "'); " + rebuild_hint);
                // One split: the call runs whole, on the configuration's kernel for its own variant.
                return choice && choice->num_splits > 1 ? choice : std::nullopt;
            });
        }
        launcher = split ? split->launcher : &named_kernel(*named, q, params, problem, gpu);
        if (split)
            check_named_kernel_runs(*named, *launcher, q, gpu);
    } else {
        const AutomaticChoice automatic = automatic_choice(dtype_of(q), params, problem, gpu, num_splits,
                                                           num_splits != 1 ? multiprocessor_count() : 0);
        launcher = automatic.choice.launcher;
        split = automatic.split;
    }
    // Grouped rows that the kernel does not read in place run on packed q and o: views where the
    // rows are evenly spaced, else copies (the output copied back into o_call once it is done).
    const bool rows_in_place = packing.active() && launcher->reads_grouped_rows;
    bool copies_back = false;
    if (packing.active() && !rows_in_place) {
        q = packing.pack(q);
        copies_back = !packing.packs_in_place(*o_call) || padding.copied;
        o_given = copies_back ? std::nullopt : std::optional(packing.pack(*o_call));
    }
    ForwardResult result;
    at::Tensor &o = result.o;
    if (o_given && padding.copied) {
        padding.check_caller_output(*o_given);
        o = at::empty(q.sizes(), o_options);
    } else if (o_given) {
        o = *o_given;
        check_output(o, q, k, v);
    } else if (padding.copied) {
        o = at::empty(q.sizes(), o_options);
    } else if (heads_first) {
        o = at::empty({q.size(0), q.size(2), q.size(1), q.size(3)}, o_options).transpose(1, 2);
    } else {
        o = at::empty(q.sizes(), o_options);
    }
    // The kernel's rows and heads per batch entry, for lse's layout: q's, or packed (grouped rows
    // read in place).
    const int64_t kernel_group = rows_in_place ? packing.group : 1;
    const int64_t lse_rows = q.size(1) * kernel_group, lse_heads = q.size(2) / kernel_group;
    if (return_lse) {
        // (batch, heads_q, seqlen_q), or with cu_seqlens (heads_q, total_q).
        result.lse = sequences.packed() ? at::empty({lse_heads, lse_rows}, q.options().dtype(at::kFloat))
                                        : at::empty({q.size(0), lse_heads, lse_rows}, q.options().dtype(at::kFloat));
        params.lse = result.lse.data_ptr<float>();
        params.lse_head_stride = lse_rows;
        params.lse_batch_stride = sequences.packed() ? 0 : lse_heads * lse_rows;
    }
    if (sequences.has_gaps()) {
        // Rows of q that no sequence uses: no kernel writes them.
        o.zero_();
        if (return_lse)
            result.lse.fill_(std::numeric_limits<float>::infinity());
    }
    const auto finished = [&](std::optional<float> runtime_ms) {
        if (padding.copied)
            o = padding.call_columns(o, o_given);
        if (packing.active()) {
            if (copies_back)
                o_call->copy_(packing.unpack(o));
            o = *o_call;
            if (return_lse)
                result.lse = packing.unpack_lse(result.lse);
        }
        if (heads_first)
            o = o.transpose(1, 2);
        if (sequences.packed())
            o = o.squeeze(0);
        result.runtime_ms = runtime_ms;
        return result;
    };
    if (params.batch == 0 || params.seqlen_q == 0 || params.heads_q == 0 || q.size(1) == 0)
        return finished(std::nullopt);
    if (params.seqlen_k == 0 || k.size(1) == 0) {
        // No key at all: every row attends nothing.
        o.zero_();
        if (return_lse)
            result.lse.fill_(std::numeric_limits<float>::infinity());
        return finished(std::nullopt);
    }

    params.q = q.data_ptr();
    params.k = k.data_ptr();
    params.v = v.data_ptr();
    params.o = o.data_ptr();
    const auto strides_of = [](const at::Tensor &t) { return TensorStrides{t.stride(0), t.stride(1), t.stride(2)}; };
    params.q_strides = strides_of(q);
    params.k_strides = strides_of(k);
    params.v_strides = strides_of(v);
    params.o_strides = strides_of(o);
    // A query's rows_per_query rows are consecutive rows (grouped rows read in place: address_rows).
    params.q_query_stride = params.rows_per_query * params.q_strides.seq;
    params.o_query_stride = params.rows_per_query * params.o_strides.seq;
    if (rows_in_place) {
        packing.address_rows(q, params.q_strides, params.q_query_stride);
        packing.address_rows(o, params.o_strides, params.o_query_stride);
    }
    if (sequences.packed()) {
        // Every sequence is in the one batch entry: the kernels' batch index must not move them (a
        // paged k and v keep theirs, which step from page to page).
        params.q_strides.batch = params.o_strides.batch = 0;
        if (!sequences.paged())
            params.k_strides.batch = params.v_strides.batch = 0;
    }
    const cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
    at::Tensor work_counter; // zeroed on the kernel's stream, by a memset that compute-sanitizer's initcheck sees
    if (launcher->needs_work_counter) {
        work_counter = at::empty({1}, q.options().dtype(at::kInt));
        params.work_counter = work_counter.data_ptr<int>();
        check_cuda(cudaMemsetAsync(params.work_counter, 0, sizeof(int), stream), "zeroing the work counter");
    }
    // A varlen kernel runs a dense call too (a split one, or a decoding configuration's, which has no
    // other): every sequence is then its batch entry's rows. Dense kernels do not read them.
    if (!sequences.any()) {
        params.sequences.rows_q = params.seqlen_q; // q's rows, or packed grouped rows
        params.sequences.rows_k = static_cast<int>(k.size(1));
    }
    at::Tensor scratch;
    if (launcher->scratch_bytes != nullptr) {
        scratch = at::empty({launcher->scratch_bytes(params)}, q.options().dtype(at::kByte));
        params.scratch = scratch.data_ptr();
    }
    std::optional<SplitBuffers> split_buffers;
    if (split)
        split_buffers.emplace(split->num_splits, o, lse_rows, lse_heads, sequences.packed(), params);
    const auto run = [&] {
        launcher->launch(params, stream);
        if (split)
            combine_splits(params.o_dtype, params, stream);
    };
    if (!benchmark) {
        run();
        return finished(std::nullopt);
    }
    EventTimer timer(stream);
    timer.start();
    run();
    timer.stop();
    return finished(timer.elapsed_ms());
}

} // namespace flash::binding
