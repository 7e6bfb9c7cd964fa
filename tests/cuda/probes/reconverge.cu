// Probe (GPGPU-Sim): a warp that diverges at a branch whose immediate post-dominator is the kernel's
// exit (the compiler tail-duplicates a uniform early return into both arms) must still run a later
// shfl.sync with every lane of its member mask, as the PTX ISA requires ("shfl.sync ... causes the
// executing thread to wait until all non-exited threads corresponding to membermask have executed
// shfl.sync with the same qualifiers"). Expected out[t] = t ^ 1 in every lane.
#include <cstdio>
template <bool kBarrier>
__global__ void k(int* flag, int* out, int n) {
  const bool go = n > 0;                      // the same in every thread
  if (threadIdx.x == 0) {                     // one lane diverges, and tests go there too
    flag[0] = go ? 1 : 0;
    if (!go && atomicCAS(&flag[1], 0, 1) == 0) flag[2] = n;
  }
  if (kBarrier) __syncthreads();              // a join no compiler may duplicate
  if (!go) return;                            // uniform early return
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}
int main() {
  int *flag, *out; cudaMalloc(&flag, 12); cudaMemset(flag, 0, 12); cudaMalloc(&out, 32 * 4);
  for (int barrier = 0; barrier < 2; ++barrier) {
    cudaMemset(out, 0xff, 32 * 4);
    if (barrier) k<true><<<1, 32>>>(flag, out, 1); else k<false><<<1, 32>>>(flag, out, 1);
    cudaDeviceSynchronize();
    int h[32]; cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int t = 0; t < 32; ++t) if (h[t] != (t ^ 1)) { if (!bad) std::printf("barrier %d: lane %d got %d, want %d\n", barrier, t, h[t], t ^ 1); ++bad; }
    std::printf("barrier %d: %d mismatches%s\n", barrier, bad,
                bad && !barrier ? " (the simulator's fault: lanes not converged at shfl.sync)" : "");
    if (barrier && bad) return 1;  // the project's workaround must hold
  }
  return 0;
}
