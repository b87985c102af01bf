// Reading a family configuration's fields from a Python object, and writing them back, by type:
// a family lists its fields once (name and C++ type) and these do the rest. Binding code only.
#pragma once

#include <limits>
#include <string>

#include <pybind11/pybind11.h>

#include "common/dtype.h"

namespace flash {

namespace py = pybind11;

inline std::string type_name(py::handle obj) { return py::str(py::type::handle_of(obj).attr("__name__")); }

inline py::object config_field(py::handle cfg, const char *field) {
    if (!py::hasattr(cfg, field))
        throw py::type_error(std::string("kernel_cfg: missing field '") + field + "'; expected a kernel configuration");
    return cfg.attr(field);
}

template <typename T>
T field_from_python(py::handle cfg, const char *field);

template <>
inline int field_from_python<int>(py::handle cfg, const char *field) {
    const py::object value = config_field(cfg, field);
    if (py::isinstance<py::bool_>(value) || !py::isinstance<py::int_>(value))
        throw py::type_error(std::string("kernel_cfg.") + field + ": expected an int, got " + type_name(value));
    const long long v = value.cast<long long>();
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max())
        throw py::value_error(std::string("kernel_cfg.") + field + ": " + std::to_string(v) + " is out of range");
    return static_cast<int>(v);
}

template <>
inline bool field_from_python<bool>(py::handle cfg, const char *field) {
    const py::object value = config_field(cfg, field);
    if (!py::isinstance<py::bool_>(value))
        throw py::type_error(std::string("kernel_cfg.") + field + ": expected a bool, got " + type_name(value));
    return value.cast<bool>();
}

template <>
inline DType field_from_python<DType>(py::handle cfg, const char *field) {
    const int code = field_from_python<int>(cfg, field);
    for (const DType dtype : {DType::FP16, DType::BF16, DType::E4M3})
        if (code == static_cast<int>(dtype))
            return dtype;
    throw py::value_error(std::string("kernel_cfg.") + field + ": expected FP16 (5), BF16 (15) or E4M3 (24), got " +
                          std::to_string(code));
}

inline py::object field_to_python(int value) { return py::int_(value); }
inline py::object field_to_python(bool value) { return py::bool_(value); }
inline py::object field_to_python(DType value) { return py::int_(static_cast<int>(value)); }

inline std::string field_text(int value) { return std::to_string(value); }
inline std::string field_text(bool value) { return value ? "true" : "false"; }
// The short forms' names (flash_helpers.dtypes.DType's).
inline std::string field_text(DType value) {
    switch (value) {
    case DType::FP16:
        return "FP16";
    case DType::BF16:
        return "BF16";
    case DType::E4M3:
        return "E4M3";
    }
    return std::to_string(static_cast<int>(value));
}

// A family's configuration read from and written to Python, and described in messages: the
// static members from_python, to_python and describe of a binding's Family struct, written from
// the family's field list (FIELDS(F) calls F(type, name) per field, in the dataclass's order).
#define FLASH_CONFIG_PYTHON_CONVERSIONS(Config, FIELDS)                                                    \
    /* Reads the fields by name from any object that has them (the Python dataclass normally). */         \
    static Config from_python(py::handle cfg) {                                                           \
        return Config{FIELDS(FLASH_READ_FIELD)};                                                          \
    }                                                                                                     \
    static py::tuple to_python(const Config &c) {                                                         \
        py::list fields;                                                                                  \
        FIELDS(FLASH_WRITE_FIELD)                                                                         \
        return py::tuple(fields);                                                                         \
    }                                                                                                     \
    static std::string describe(const Config &c) {                                                        \
        std::string text;                                                                                 \
        FIELDS(FLASH_DESCRIBE_FIELD)                                                                      \
        return #Config "{" + text + "}";                                                                  \
    }
#define FLASH_READ_FIELD(type, name) field_from_python<type>(cfg, #name),
#define FLASH_WRITE_FIELD(type, name) fields.append(field_to_python(c.name));
#define FLASH_DESCRIBE_FIELD(type, name) text += (text.empty() ? "" : ", ") + field_text(c.name);

} // namespace flash
