// Probe (GPGPU-Sim): conversions from 32- and 64-bit integers to fp32/fp64 (cvt.rn.f{32,64}.{s,u}{32,64}) against the
// host, on 256 values from -20 to +-2^62. Under the simulator without tools/gpusim-ptx-filter.sh every 64-bit source
// converts wrongly (253 of 256; -20 gives 0); with it, 0 wrong. On a GPU, 0 wrong.
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <random>
#include <vector>
__global__ void k(const long long* x, float* o, double* od, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const long long v = x[i];
  const int s = static_cast<int>(v); const unsigned u = static_cast<unsigned>(v);
  o[i * 6 + 0] = static_cast<float>(s);               // cvt.rn.f32.s32
  o[i * 6 + 1] = static_cast<float>(u);               // cvt.rn.f32.u32
  o[i * 6 + 2] = static_cast<float>(static_cast<unsigned long long>(v));  // cvt.rn.f32.u64
  o[i * 6 + 3] = static_cast<float>(v);               // cvt.rn.f32.s64
  od[i * 3 + 0] = static_cast<double>(s);             // cvt.rn.f64.s32
  od[i * 3 + 1] = static_cast<double>(u);             // cvt.rn.f64.u32
  od[i * 3 + 2] = static_cast<double>(static_cast<unsigned long long>(v));  // cvt.rn.f64.u64
}
int main() {
  const int n = 256;
  std::mt19937_64 rng(2);
  std::vector<long long> x(n);
  for (int i = 0; i < n; ++i) x[i] = i < 40 ? i - 20 : static_cast<long long>(rng() >> (rng() % 62 + 1)) * (i % 2 ? 1 : -1);
  long long* dx; float* d; double* dd;
  cudaMalloc(&dx, n * 8); cudaMalloc(&d, n * 6 * 4); cudaMalloc(&dd, n * 3 * 8);
  cudaMemcpy(dx, x.data(), n * 8, cudaMemcpyHostToDevice);
  k<<<1, n>>>(dx, d, dd, n); cudaDeviceSynchronize();
  std::vector<float> o(n * 6); std::vector<double> od(n * 3);
  cudaMemcpy(o.data(), d, o.size() * 4, cudaMemcpyDeviceToHost); cudaMemcpy(od.data(), dd, od.size() * 8, cudaMemcpyDeviceToHost);
  const char* names[] = {"cvt.rn.f32.s32", "cvt.rn.f32.u32", "cvt.rn.f32.u64", "cvt.rn.f32.s64", "cvt.rn.f64.s32", "cvt.rn.f64.u32", "cvt.rn.f64.u64"};
  int bad[7] = {0};
  for (int i = 0; i < n; ++i) {
    const long long v = x[i]; const int s = int(v); const unsigned u = unsigned(v);
    const float wf[4] = {float(s), float(u), float((unsigned long long)v), float(v)};
    const double wd[3] = {double(s), double(u), double((unsigned long long)v)};
    for (int j = 0; j < 4; ++j) if (std::memcmp(&o[i * 6 + j], &wf[j], 4)) { if (!bad[j]) std::printf("%s(%lld): got %.9g want %.9g\n", names[j], v, o[i*6+j], wf[j]); ++bad[j]; }
    for (int j = 0; j < 3; ++j) if (std::memcmp(&od[i * 3 + j], &wd[j], 8)) { if (!bad[4+j]) std::printf("%s(%lld): got %.17g want %.17g\n", names[4+j], v, od[i*3+j], wd[j]); ++bad[4 + j]; }
  }
  int total = 0;
  for (int j = 0; j < 7; ++j) {
    std::printf("%s: %d of %d wrong\n", names[j], bad[j], n);
    total += bad[j];
  }
  return total == 0 ? 0 : 1;
}
