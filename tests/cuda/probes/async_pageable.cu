// Probe (GPGPU-Sim): cudaMemcpyAsync from pageable host memory on a created stream. CUDA documents
// that for pageable host-to-device copies "the function will return once the pageable buffer has
// been copied to the staging memory", so the caller may reuse the buffer at once. Expected: the
// device holds the values the buffer had at the call (1.0), not those written after it (2.0).
#include <cstdio>
#include <vector>
int main() {
  cudaStream_t s;
  cudaStreamCreate(&s);
  float* d;
  cudaMalloc(&d, 1024 * sizeof(float));
  std::vector<float> host(1024, 1.0f);
  cudaMemcpyAsync(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice, s);
  for (auto& x : host) x = 2.0f;  // reuse the buffer, as CUDA allows
  std::vector<float> back(1024, 0.0f);
  cudaMemcpyAsync(back.data(), d, back.size() * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  int wrong = 0;
  for (float x : back) wrong += x != 1.0f;
  std::printf("async pageable upload: %d of 1024 wrong (first %g, want 1)\n", wrong, back[0]);
  return wrong == 0 ? 0 : 1;
}
