// Host side of the thread-block cluster kernels (select_cluster.cu, super.cu): a launch
// configuration of kThreads-thread blocks in clusters along x.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "select_common.cuh"

namespace locks::cuda::detail {
namespace {

// The attribute lives beside the configuration that points to it, hence not copyable.
struct ClusterLaunch {
  cudaLaunchAttribute attr[1];
  cudaLaunchConfig_t lc = {};
  ClusterLaunch(dim3 grid, int cs, cudaStream_t st, size_t dynamic_smem = 0) {
    lc.gridDim = grid;
    lc.blockDim = dim3(kThreads);
    lc.dynamicSmemBytes = dynamic_smem;
    lc.stream = st;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = unsigned(cs);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    lc.attrs = attr;
    lc.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace
}  // namespace locks::cuda::detail
