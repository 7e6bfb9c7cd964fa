// dist::select_pools over NCCL: every GPU of this machine a rank (one thread each, ncclCommInitAll),
// against the unsharded selection on the random cases of tests/dist/sharded_selection.hpp.
//   kvpolicy_dist_select_nccl [CASES]      exit 77 (SKIPPED) without a GPU
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "kvpolicy/dist/nccl.hpp"
#include "sharded_selection.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("dist_select_nccl: SKIPPED (no GPU)\n");
    return 77;
  }
  const long cases = argc > 1 ? std::atol(argv[1]) : 300;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(devices));
  if (ncclCommInitAll(comms.data(), devices, nullptr) != ncclSuccess) {
    std::fprintf(stderr, "dist_select_nccl: ncclCommInitAll failed\n");
    return 2;
  }
  std::vector<std::int64_t> bad(static_cast<std::size_t>(devices), 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < devices; ++r)
    ranks.emplace_back([&, r] {
      cudaSetDevice(r);
      kvpolicy::dist::Nccl comm(comms[static_cast<std::size_t>(r)]);
      for (long seed = 1; seed <= cases; ++seed)
        bad[static_cast<std::size_t>(r)] += disttest::mismatches(comm, disttest::draw(static_cast<std::uint64_t>(seed), devices));
    });
  for (auto& t : ranks) t.join();
  for (auto c : comms) ncclCommDestroy(c);
  std::int64_t total = 0;
  for (const auto b : bad) total += b;
  std::printf("dist::select_pools over NCCL on %d GPUs: %ld cases, %lld differences\n", devices, cases,
              static_cast<long long>(total));
  return total == 0 ? 0 : 1;
}
