// The tiled CPU attention compiled once for the project's own programs: they define
// KVPOLICY_EXTERN_TILED_ATTENTION and link this object (the kvpolicy_tiled_attention target in
// CMakeLists.txt), so no other translation unit compiles the kernel. A program of yours can do the
// same (docs/integration.md, "Compile time").
#include "kvpolicy/cpu/tiled_attention_instances.hpp"
