#include <pybind11/pybind11.h>
namespace py = pybind11;
PYBIND11_MODULE(_core, m) { m.doc() = "memr1 memory_store native core"; }
