// Decoding one call's Python arguments into C++ values, each with the message a bad one raises: the
// message starts with the argument's name and states the rule (TypeError for a bad type, ValueError
// for a bad value). Messages are built without iostreams: string streams inside an extension module
// have crashed on systems whose C++ runtime differs from the one torch was built with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include <torch/extension.h>

#include "binding/python_fields.h"
#include "common/forward_params.h"

namespace flash::binding {

namespace py = pybind11;

inline std::string shape_str(const at::Tensor &t) {
    std::string text = "[";
    for (int dim = 0; dim < t.dim(); ++dim)
        text += (dim ? ", " : "") + std::to_string(t.size(dim));
    return text + "]";
}

inline std::string dtype_str(const at::Tensor &t) { return c10::toString(t.scalar_type()); }

inline at::Tensor tensor_argument(py::handle obj, const char *name) {
    if (!THPVariable_Check(obj.ptr()))
        throw py::type_error(std::string(name) + ": expected a torch.Tensor, got " + type_name(obj));
    return THPVariable_Unpack(obj.ptr());
}

// A Python float or int (not a bool), as a double; its value is checked where it is used.
inline double number_argument(py::handle value, const char *name) {
    if (py::isinstance<py::bool_>(value) || !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)))
        throw py::type_error(std::string(name) + ": expected a float, got " + type_name(value));
    return value.cast<double>();
}

inline float finite_value(double v, const char *name) {
    if (!std::isfinite(v))
        throw py::value_error(std::string(name) + ": must be finite, got " + std::to_string(v));
    return static_cast<float>(v);
}

// FlashAttention-2's window_size (left, right), as given: -1 leaves a side unbounded.
struct Window {
    int left;
    int right;
};

inline Window make_window(int64_t left, int64_t right) {
    const auto side = [](int64_t v, const char *which) {
        if (v < -1)
            throw py::value_error(std::string("window_size: ") + which + " must be -1 (unbounded) or >= 0, got " +
                                  std::to_string(v));
        return static_cast<int>(std::min<int64_t>(v, UNBOUNDED_WINDOW));
    };
    return Window{side(left, "left"), side(right, "right")};
}

inline Window window_argument(py::handle value) {
    const auto is_int = [](py::handle side) { return py::isinstance<py::int_>(side) && !py::isinstance<py::bool_>(side); };
    const bool pair = (py::isinstance<py::tuple>(value) || py::isinstance<py::list>(value)) && py::len(value) == 2;
    if (!pair || !is_int(value[py::int_(0)]) || !is_int(value[py::int_(1)]))
        throw py::type_error("window_size: expected a pair (left, right) of ints, got " +
                             std::string(py::str(py::repr(value))));
    return make_window(value[py::int_(0)].cast<int64_t>(), value[py::int_(1)].cast<int64_t>());
}

} // namespace flash::binding
