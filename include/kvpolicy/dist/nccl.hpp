/// \file
/// kvpolicy/dist/nccl.hpp — dist::Communicator over NCCL, for an engine whose tensor-parallel group
/// is an ncclComm_t it already holds (one rank per GPU: NCCL refuses two ranks of one communicator
/// on the same GPU). The collectives the sharded selection needs are a few KB of int64 counts
/// (dist/select.hpp); float sums serve a split model. Both are staged through a device buffer this
/// object owns and run on `stream`, which each call synchronizes. Needs <nccl.h> (the `nvidia-nccl-cu13` wheel ships it, or the engine's own NCCL);
/// an NCCL or CUDA error throws kvpolicy::Error naming the rank.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <span>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/dist/communicator.hpp"

namespace kvpolicy::dist {

/// dist::Communicator over an ncclComm_t the engine owns, on its stream (this file's comment).
class Nccl {
 public:
  explicit Nccl(ncclComm_t comm, cudaStream_t stream = nullptr) : comm_(comm), stream_(stream) {
    require(comm != nullptr, "dist::Nccl: no communicator");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &size_), "ncclCommCount");
  }
  Nccl(const Nccl&) = delete;
  Nccl& operator=(const Nccl&) = delete;
  ~Nccl() {
    if (buffer_ != nullptr) cudaFree(buffer_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  void all_reduce_sum(std::span<std::int64_t> values) {
    collective(values.data(), values.size_bytes(), values.size(), ncclInt64, -1);
  }
  void all_reduce_sum(std::span<float> values) {
    collective(values.data(), values.size_bytes(), values.size(), ncclFloat32, -1);
  }
  void broadcast(std::span<std::int64_t> values, int root) {
    collective(values.data(), values.size_bytes(), values.size(), ncclInt64, root);
  }
  void broadcast(std::span<float> values, int root) {
    collective(values.data(), values.size_bytes(), values.size(), ncclFloat32, root);
  }

 private:
  // host values through the device buffer (grown to the largest call): summed over the ranks
  // (root < 0), or rank root's
  void collective(void* values, std::size_t bytes, std::size_t count, ncclDataType_t type, int root) {
    if (count == 0) return;
    if (bytes > capacity_) {
      if (buffer_ != nullptr) cuda(cudaFree(buffer_), "cudaFree");
      buffer_ = nullptr;
      capacity_ = 0;
      cuda(cudaMalloc(&buffer_, bytes), "cudaMalloc");
      capacity_ = bytes;
    }
    cuda(cudaMemcpyAsync(buffer_, values, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
    if (root < 0)
      check(ncclAllReduce(buffer_, buffer_, count, type, ncclSum, comm_, stream_), "ncclAllReduce");
    else
      check(ncclBroadcast(buffer_, buffer_, count, type, root, comm_, stream_), "ncclBroadcast");
    cuda(cudaMemcpyAsync(values, buffer_, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  void check(ncclResult_t r, const char* call) const {
    if (r != ncclSuccess) fail("dist::Nccl: rank ", rank_, ": ", call, " failed: ", ncclGetErrorString(r));
  }
  void cuda(cudaError_t e, const char* call) const {
    if (e != cudaSuccess) fail("dist::Nccl: rank ", rank_, ": ", call, " failed: ", cudaGetErrorString(e));
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_ = -1;
  int size_ = 0;
  void* buffer_ = nullptr;
  std::size_t capacity_ = 0;  // bytes
};

static_assert(Communicator<Nccl>, "dist::Nccl must model dist::Communicator");

}  // namespace kvpolicy::dist
