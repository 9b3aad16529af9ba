// The one symbol the JAX FFI library exports: its registration table (ffi_common.h), read by qkernels/jax/_ffi.py.
#include "ffi_common.h"

// Copies up to `capacity` entries (name, handler, platform, whether it runs an op) into the four arrays; returns
// the table's size.
extern "C" __attribute__((visibility("default"))) int64_t qk_ffi_targets(const char** names, void** handlers,
                                                                          const char** platforms, int32_t* ops,
                                                                          int64_t capacity) {
  const auto& table = qkernels::jaxffi::targets();
  for (int64_t i = 0; i < capacity && i < static_cast<int64_t>(table.size()); ++i) {
    names[i] = table[i].name;
    handlers[i] = reinterpret_cast<void*>(table[i].handler);
    platforms[i] = table[i].platform;
    ops[i] = table[i].op ? 1 : 0;
  }
  return static_cast<int64_t>(table.size());
}
