//===- PythonCalls.h - The torch extension's calls into Python ---*- C++ -*-===//
//
// Part of the MoE-MLIR project.
//
//===----------------------------------------------------------------------===//
//
// The extension calls Python in two places: the kernel cache's loader on a
// kernel miss (TorchKernels.cpp) and the autograd path of the ops whose
// autograd is Python's (TorchOps.cpp). Both hold the GIL for the call and turn
// a Python exception into the matching c10 error. Defined in TorchKernels.cpp.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_RUNTIME_TORCH_PYTHONCALLS_H
#define MOE_LIB_RUNTIME_TORCH_PYTHONCALLS_H

#include <Python.h>

namespace moe_torch {

/// Holds the GIL for its lifetime.
struct Gil {
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

/// Raises the pending Python exception as the matching c10 error.
[[noreturn]] void rethrowPython();

/// `fn(*args)` (steals `args`) with the GIL held by the caller; a Python
/// exception becomes the matching c10 error.
PyObject *callPython(PyObject *fn, PyObject *args);

/// Registers the Python kernel cache's `load(key, shapes, validate_only)`
/// (moeTorchSetLoader), which lookup() and validateOnly() call on a miss.
void setLoader(PyObject *fn);

/// Forgets the in-memory kernels (moeTorchClearKernels).
void clearKernels();

} // namespace moe_torch

#endif // MOE_LIB_RUNTIME_TORCH_PYTHONCALLS_H
