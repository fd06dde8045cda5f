// Python -> C++ argument conversion for the bindings (module.cpp and bases.cpp): strict types,
// nothing converted silently; a wrong argument is BadInput (InvalidInput in Python).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <string>
#include <vector>

#include "core.h"

namespace memr1 {
namespace py = pybind11;

inline py::object errors() { return py::module_::import("memr1.memory_store.errors"); }

inline void raise_as(const char* cls, py::tuple args) {
  py::object inst = errors().attr(cls)(*args);
  PyErr_SetObject(py::type::handle_of(inst).ptr(), inst.ptr());
}

inline std::string type_name(py::handle h) { return py::str(py::type::handle_of(h).attr("__name__")); }

// Strings are taken only from str (not bytes, which pybind11 would accept), as UTF-8.
inline std::string as_str(py::handle h, const char* what) {
  if (!PyUnicode_Check(h.ptr())) throw BadInput(std::string(what) + " must be a str, got " + type_name(h));
  Py_ssize_t n;
  const char* s = PyUnicode_AsUTF8AndSize(h.ptr(), &n);
  if (!s) {
    PyErr_Clear();
    throw BadInput(std::string(what) + " is not encodable as UTF-8 (it holds a lone surrogate)");
  }
  return std::string(s, static_cast<size_t>(n));
}

// A memory id is an int (or an integer-like object such as numpy.int64), never a bool: Delete(True)
// must not delete id 1. An int outside int64 is an id that was never added.
inline int64_t as_id(py::handle h) {
  PyObject* o = h.ptr();
  if (PyBool_Check(o) || !PyIndex_Check(o))
    throw BadInput("memory id must be an int in [0, 2**63), got " + type_name(h) + " " + std::string(py::repr(h)));
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow) {
    raise_as("UnknownMemoryId", py::make_tuple(h));
    throw py::error_already_set();
  }
  return v;
}

// A vector argument must be a 1-d native-endian float32 numpy array of the bank's dim; nothing is
// converted silently, because a float64, byte-swapped or wrongly shaped array is almost always a caller
// bug. It is copied first (strided views too), so another thread writing the caller's array meanwhile
// cannot change what is validated, logged and stored.
inline std::vector<float> as_vector(py::handle h, int dim) {
  if (!py::isinstance<py::array>(h))
    throw BadInput("vector must be a numpy float32 array, got " + type_name(h));
  auto a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().equal(py::dtype::of<float>()))
    throw BadInput("vector dtype is " + std::string(py::str(a.dtype())) + ", expected native-endian float32");
  if (a.ndim() != 1 || a.shape(0) != dim) {
    std::string shape = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) shape += std::to_string(a.shape(i)) + (i + 1 < a.ndim() ? ", " : "");
    throw BadInput("vector shape is " + shape + "), expected (" + std::to_string(dim) + ",)");
  }
  std::vector<float> out(static_cast<size_t>(dim));
  const char* p = static_cast<const char*>(a.data());
  const py::ssize_t stride = a.strides(0);
  if (stride == sizeof(float)) std::memcpy(out.data(), p, sizeof(float) * out.size());
  else for (int i = 0; i < dim; ++i) std::memcpy(&out[i], p + i * stride, sizeof(float));
  return out;
}

// An op's source turn ids: a tuple (or list) of str, never a bare str, whose characters would each
// become an id. Only types are checked here; State::check_sources checks the bounds, for replay too.
inline Sources as_sources(py::handle h) {
  PyObject* o = h.ptr();
  const bool tuple = PyTuple_Check(o);
  if (tuple && PyTuple_GET_SIZE(o) == 0) return {};  // the default: no work on the op's hot path
  if (!tuple && !PyList_Check(o))
    throw BadInput("sources must be a tuple of str (dialogue turn ids such as \"D3:7\"), got " + type_name(h));
  const Py_ssize_t n = tuple ? PyTuple_GET_SIZE(o) : PyList_GET_SIZE(o);
  if (static_cast<size_t>(n) > kMaxOpSources)  // before converting: the count alone refuses it
    throw BadInput("sources holds " + std::to_string(n) + " turn ids, over the limit of " +
                   std::to_string(kMaxOpSources) + " per op");
  Sources out;
  out.reserve(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = tuple ? PyTuple_GET_ITEM(o, i) : PyList_GET_ITEM(o, i);
    out.push_back(as_str(item, ("sources[" + std::to_string(i) + "]").c_str()));
  }
  return out;
}

// bases.cpp: a base's native rows from the segment's Python rows (tuples as Segment.core_rows gives
// them), or copied from a snapshot's live records over their vectors (no Python object; no GIL needed).
std::shared_ptr<Base> make_base(py::array vectors, py::list rows, int dim);
std::shared_ptr<Base> copy_base(const std::vector<const Record*>& recs, const float* vectors, int dim);

}  // namespace memr1
