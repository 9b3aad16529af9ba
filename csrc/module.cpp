// Python module shell for qkernels._C: importing it loads the TORCH_LIBRARY registrations
// of every kernel file linked into this shared object.
#include <Python.h>

extern "C" {
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}
