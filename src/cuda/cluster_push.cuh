// Pushing small values into the shared memory of the other blocks of a thread-block cluster,
// with a transaction-count mbarrier per receive buffer (the Hopper DSMEM protocol: each
// st.async / red.async completes its bytes on the receiver's mbarrier, whose complete_tx has
// release semantics at cluster scope; the receiver waits on its own mbarrier with acquire).
// Unlike cluster.sync(), which compiles to a GPU-wide memory fence (MEMBAR.ALL.GPU) plus a
// cluster barrier before every exchange, a push costs one remote store a value and the
// receiver waits only for the bytes it expects (docs/cuda_notes.md, v24).
//
// Rules the callers keep: every mbarrier is initialised, and that made visible cluster-wide
// (fence_init + a cluster barrier), before any peer pushes to it; a buffer is cleared (for
// red.async) or read out before the pushes of its next use can start; each phase expects
// exactly the bytes pushed to it; a block exits only after it has waited for every push
// addressed to it.
#pragma once

#include <cooperative_groups.h>

#include <cuda/ptx>

namespace locks::cuda::detail {
namespace {

namespace ptx = ::cuda::ptx;

// Thread 0 (after which the caller syncs the block): a one-arrival transaction barrier.
__device__ __forceinline__ void push_barrier_init(uint64_t* bar) { ptx::mbarrier_init(bar, 1); }

// Orders every block's mbarrier inits before the peers' pushes (then a cluster barrier).
__device__ __forceinline__ void push_barrier_fence_init() {
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

// One thread of the receiving block, once a phase: the bytes this phase will receive.
__device__ __forceinline__ void push_expect(uint64_t* bar, uint32_t bytes) {
  ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}

// Every thread that reads the received values: wait for the phase of this parity.
__device__ __forceinline__ void push_wait(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(ptx::sem_acquire, ptx::scope_cluster, bar, parity)) {
  }
}

// The peer's copy of a shared-memory object of this block.
template <typename T>
__device__ __forceinline__ T* peer(const cooperative_groups::cluster_group& c, T* p, int rank) {
  return c.map_shared_rank(p, rank);
}

// Stores v into the peer's *dst (a 4-byte complete_tx on the peer's *bar).
__device__ __forceinline__ void push_store(uint32_t* peer_dst, uint32_t v, uint64_t* peer_bar) {
  ptx::st_async(peer_dst, v, peer_bar);
}

// Adds v to the peer's *dst (a 4-byte complete_tx on the peer's *bar).
__device__ __forceinline__ void push_add(uint32_t* peer_dst, uint32_t v, uint64_t* peer_bar) {
  ptx::red_async(ptx::op_add, peer_dst, v, peer_bar);
}

// A cluster barrier that orders nothing (no GPU-wide fence): used only so that no block
// exits while a push it issued may still be in flight (every block arrives after it has
// received all pushes addressed to it, and waits before it exits).
__device__ __forceinline__ void cluster_arrive_relaxed() {
  ptx::barrier_cluster_arrive(ptx::sem_relaxed);
}
__device__ __forceinline__ void cluster_wait() { ptx::barrier_cluster_wait(); }

}  // namespace
}  // namespace locks::cuda::detail
