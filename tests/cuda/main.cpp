// The CUDA test runner. `--host-only` runs the cases of the test suite "host" (argument checks and
// workspace sizing, which never touch a device) and passes on any machine. Otherwise every case
// runs on the GPU; without a CUDA device the run reports SKIPPED (exit 77, ctest SKIP_RETURN_CODE)
// rather than passing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvpolicy/cuda/primitives/check.cuh"

int main(int argc, char** argv) {
  bool host_only = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--host-only") == 0)
      host_only = true;
    else
      args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  if (host_only) {
    context.addFilter("test-suite", "host");
  } else if (!kvpolicy::gpu::device_present()) {
    std::printf("kvpolicy CUDA tests: no CUDA device here: SKIPPED (the GPU cases were compiled, not run)\n");
    return 77;
  }
  return context.run();
}
