// SummaryStore: owning host arrays for one precision's summary layout.
#include "locks/summary.h"

namespace locks {

SummaryStore::SummaryStore(const SummaryLayout& layout) : layout_(layout) {
  validate_summary_layout(layout_);
  const size_t nh = size_t(layout_.num_blocks) * size_t(layout_.num_kv_heads);
  const size_t d = size_t(layout_.head_dim), r = size_t(layout_.rank);
  const size_t P = size_t(layout_.page_size);
  if (layout_.precision == Precision::fp32) {
    mu_.assign(nh * d, 0.0f);
    basis_.assign(nh * r * d, 0.0f);
    coeff_.assign(nh * P * r, 0.0f);
  } else {
    mu_q_.assign(nh * d, 0);
    mu_scale_.assign(nh, 0.0f);
    basis_q_.assign(nh * r * d / 2, 0);
    basis_scale_.assign(nh * size_t(basis_scales_per_head(layout_)), 0.0f);
    coeff_q_.assign(nh * P * r, 0);
    coeff_scale_.assign(nh * r, 0.0f);
  }
}

SummaryView SummaryStore::view() {
  SummaryView v;
  v.layout = layout_;
  if (layout_.precision == Precision::fp32) {
    v.mu = mu_.data();
    v.basis = basis_.data();
    v.coeff = coeff_.data();
  } else {
    v.mu_q = mu_q_.data();
    v.mu_scale = mu_scale_.data();
    v.basis_q = basis_q_.data();
    v.basis_scale = basis_scale_.data();
    v.coeff_q = coeff_q_.data();
    v.coeff_scale = coeff_scale_.data();
  }
  return v;
}

}  // namespace locks
