// Device arrays of super summaries (super_summary.h) mirroring a host SuperStore: upload
// (CPU-built summaries to the GPU) and download (GPU-built summaries back for comparison).
#pragma once

#include "gpu_helpers.h"
#include "locks/super_summary.h"

namespace locks::cuda_test {

struct GpuSupers {
  SuperStore host;
  DevBuf<int8_t> mu_q, coord_q, lo_q, hi_q;
  DevBuf<uint8_t> basis_q, radius_q;
  DevBuf<float> mu_scale, basis_scale, coord_scale, radius_scale, extent_scale;
  explicit GpuSupers(const SuperLayout& l) : host(l) {}
  // The host store's arrays to (new) device buffers.
  void upload() {
    const SuperView h = host.view();
    const SuperLayout& l = h.layout;
    const size_t gh = size_t(l.num_slots) * l.num_kv_heads, d = l.head_dim, R = l.rank,
                 S = l.group_pages;
    auto up8 = [](DevBuf<int8_t>& b, const int8_t* p, size_t n) {
      b = DevBuf<int8_t>(n);
      b.upload(p, n);
    };
    auto upu = [](DevBuf<uint8_t>& b, const uint8_t* p, size_t n) {
      b = DevBuf<uint8_t>(n);
      b.upload(p, n);
    };
    auto upf = [](DevBuf<float>& b, const float* p, size_t n) {
      b = DevBuf<float>(n);
      b.upload(p, n);
    };
    up8(mu_q, h.mu_q, gh * d);
    upf(mu_scale, h.mu_scale, gh);
    upu(basis_q, h.basis_q, gh * R * d / 2);
    upf(basis_scale, h.basis_scale, gh * R);
    up8(coord_q, h.coord_q, gh * S * R);
    upf(coord_scale, h.coord_scale, gh * R);
    upu(radius_q, h.radius_q, gh * S);
    upf(radius_scale, h.radius_scale, gh);
    if (l.extent) {
      up8(lo_q, h.lo_q, gh * S * R);
      up8(hi_q, h.hi_q, gh * S * R);
      upf(extent_scale, h.extent_scale, gh * R);
    }
  }
  // The device arrays back into the host store (after a GPU build).
  void download() {
    SuperView h = host.view();
    const SuperLayout& l = h.layout;
    const size_t gh = size_t(l.num_slots) * l.num_kv_heads, d = l.head_dim, R = l.rank,
                 S = l.group_pages;
    auto get = [](auto* dst, const auto& b, size_t n) {
      CK(cudaMemcpy(dst, b.p, n * sizeof(*dst), cudaMemcpyDeviceToHost));
    };
    get(h.mu_q, mu_q, gh * d);
    get(h.mu_scale, mu_scale, gh);
    get(h.basis_q, basis_q, gh * R * d / 2);
    get(h.basis_scale, basis_scale, gh * R);
    get(h.coord_q, coord_q, gh * S * R);
    get(h.coord_scale, coord_scale, gh * R);
    get(h.radius_q, radius_q, gh * S);
    get(h.radius_scale, radius_scale, gh);
    if (l.extent) {
      get(h.lo_q, lo_q, gh * S * R);
      get(h.hi_q, hi_q, gh * S * R);
      get(h.extent_scale, extent_scale, gh * R);
    }
  }
  SuperView dview() {
    SuperView v;
    v.layout = host.layout();
    v.mu_q = mu_q.p, v.mu_scale = mu_scale.p, v.basis_q = basis_q.p, v.basis_scale = basis_scale.p;
    v.coord_q = coord_q.p, v.coord_scale = coord_scale.p, v.radius_q = radius_q.p;
    v.radius_scale = radius_scale.p, v.lo_q = lo_q.p, v.hi_q = hi_q.p;
    v.extent_scale = extent_scale.p;
    return v;
  }
};

}  // namespace locks::cuda_test
