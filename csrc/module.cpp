// Python module shell for qkernels._C: importing it loads the STABLE_TORCH_LIBRARY registrations of
// every kernel file linked into this shared object. Only Python's limited API (Py_LIMITED_API is set
// by setup.py: abi3, one build for CPython >= 3.10) and no torch here.
#include <Python.h>

// PyMODINIT_FUNC: extern "C" and exported (the only symbol _C exports: setup.py hides the rest)
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
