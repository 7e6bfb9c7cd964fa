/// \file
/// kvpolicy/dist/mpi.hpp — dist::Communicator over MPI (Debian's OpenMPI: libopenmpi-dev), for CPU
/// caches sharded over the ranks of the engine's MPI communicator (its tensor-parallel group). The
/// engine initializes MPI and owns the communicator; this wraps it and never frees it. An MPI error
/// throws kvpolicy::Error with the rank and MPI's own message: the communicator must then be set to
/// MPI_ERRORS_RETURN (the constructor does so; MPI's default aborts every rank instead).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>

#include "kvpolicy/core/error.hpp"
#include "kvpolicy/dist/communicator.hpp"

namespace kvpolicy::dist {

/// dist::Communicator over an MPI communicator the engine owns (this file's comment).
class Mpi {
 public:
  explicit Mpi(MPI_Comm comm) : comm_(comm) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    require(initialized != 0, "dist::Mpi: MPI is not initialized (the engine calls MPI_Init first)");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }

  void all_reduce_sum(std::span<std::int64_t> values) { sum(values.data(), values.size(), MPI_LONG_LONG); }
  void all_reduce_sum(std::span<float> values) { sum(values.data(), values.size(), MPI_FLOAT); }
  void broadcast(std::span<std::int64_t> values, int root) { bcast(values.data(), values.size(), MPI_LONG_LONG, root); }
  void broadcast(std::span<float> values, int root) { bcast(values.data(), values.size(), MPI_FLOAT, root); }

 private:
  static_assert(sizeof(std::int64_t) == sizeof(long long), "MPI_LONG_LONG carries int64");
  void sum(void* values, std::size_t count, MPI_Datatype type) {
    require(count <= static_cast<std::size_t>(INT32_MAX), "dist::Mpi: ", count, " values in one all-reduce");
    if (count == 0) return;
    check(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), type, MPI_SUM, comm_), "MPI_Allreduce");
  }
  void bcast(void* values, std::size_t count, MPI_Datatype type, int root) {
    require(count <= static_cast<std::size_t>(INT32_MAX), "dist::Mpi: ", count, " values in one broadcast");
    require(root >= 0 && root < size_, "dist::Mpi: broadcast from rank ", root, " of ", size_);
    if (count == 0) return;
    check(MPI_Bcast(values, static_cast<int>(count), type, root, comm_), "MPI_Bcast");
  }
  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    fail("dist::Mpi: rank ", rank_, ": ", call, " failed: ", std::string(text, static_cast<std::size_t>(length)));
  }

  MPI_Comm comm_;
  int rank_ = -1;
  int size_ = 0;
};

static_assert(Communicator<Mpi>, "dist::Mpi must model dist::Communicator");

}  // namespace kvpolicy::dist
