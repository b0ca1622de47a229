// The one CUDA status check of the project: LOCKS_CUDA_CHECK(call) throws locks::CudaError
// naming the call, the status and the place. Overloads of locks::cuda::check for other
// status types (cuSOLVER in the comparison library) use the same macro.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "locks/error.h"

namespace locks::cuda {

[[noreturn]] inline void cuda_fail(const std::string& status, const char* what, const char* file,
                                   int line) {
  throw CudaError("CUDA error " + status + " at " + file + ":" + std::to_string(line) + " (" +
                  what + ")");
}

inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) cuda_fail(cudaGetErrorString(e), what, file, line);
}

}  // namespace locks::cuda

#define LOCKS_CUDA_CHECK(x) ::locks::cuda::check((x), #x, __FILE__, __LINE__)
#define LOCKS_CUDA_LAUNCHED() LOCKS_CUDA_CHECK(cudaGetLastError())
