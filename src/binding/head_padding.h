// Head sizes that are not a multiple of 16 bytes, the kernels' copy width (8 elements of a 16-bit
// type, as 59 or 111; 16 of e4m3, as 72): those calls run on copies of q, k and v with zero columns
// up to the next multiple, and their output is the call's columns of the padded one. (Every other
// head size below the served configuration's is read and written in place: the Hopper family's
// tensor maps end at the call's d_head, the SM80 family's masked-tails copies predicate the columns
// past it.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/extension.h>

#include "binding/arguments.h"
#include "binding/tensor_checks.h"

namespace flash::binding {

struct HeadPadding {
    at::Tensor call_q; // the call's q, before any padding
    int64_t call_d_head; // its last dimension (0 where q is not 4-D)
    bool copied = false;

    explicit HeadPadding(const at::Tensor &q) : call_q(q), call_d_head(q.dim() == 4 ? q.size(3) : 0) {}

    // Replaces q, k and v by copies with zero columns up to d_head, where the three are 4-D and agree
    // on the call's d_head (elsewhere the checks that follow name what is wrong).
    void pad(at::Tensor &q, at::Tensor &k, at::Tensor &v, int64_t d_head) {
        const bool agree = q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(3) == call_d_head &&
                           v.size(3) == call_d_head && q.size(3) < d_head;
        if (!agree)
            return;
        for (at::Tensor *t : {&q, &k, &v})
            *t = at::constant_pad_nd(*t, {0, d_head - t->size(3)});
        copied = true;
    }

    // An o given by the caller, where the kernel writes a padded one (its dtype checked by
    // check_output_dtype): the call's q's shape and device.
    void check_caller_output(const at::Tensor &o) const {
        check_same_device(o, "o", call_q);
        if (o.sizes() != call_q.sizes())
            throw py::value_error("o: shape " + shape_str(o) + " differs from q's " + shape_str(call_q) +
                                  "; o must have q's (batch, seqlen_q, heads_q, d_head) shape");
    }

    // The call's columns of the padded output, written to the caller's o where given.
    at::Tensor call_columns(const at::Tensor &padded, const std::optional<at::Tensor> &o_given) const {
        const at::Tensor columns = padded.narrow(3, 0, call_d_head);
        if (!o_given)
            return columns;
        o_given->copy_(columns);
        return *o_given;
    }
};

} // namespace flash::binding
