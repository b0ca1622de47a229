// Torch tensors -> the two-level views (include/locks/super_summary.h): the super summaries
// list and the super table, checked once here for both backends (the core re-checks values).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>

#include "locks/kv_cache.h"
#include "locks/super_summary.h"
#include "torch_views.h"

namespace locks_torch {

// The super summaries list, slots = super-page storage ids, H KV heads, S pages a group, R the
// group rank (super_summary.h): 8 tensors (centroid layout) or 11 (extent layout):
//   mu_q i8 [slots, H, d], mu_scale f32 [slots, H], basis_q u8 [slots, H, R, d/2],
//   basis_scale f32 [slots, H, R], coord_q i8 [slots, H, S, R], coord_scale f32 [slots, H, R],
//   radius_q u8 [slots, H, S], radius_scale f32 [slots, H]
//   (+ lo_q i8 [slots, H, S, R], hi_q i8 [slots, H, S, R], extent_scale f32 [slots, H, R]).
// page_size and the geometry (H, d) come from the cache.
inline locks::SuperView super_view(at::TensorList s, const locks::CacheLayout& cache) {
  TORCH_CHECK_VALUE(s.size() == 8 || s.size() == 11,
                    "supers: expected 8 tensors (mu_q, mu_scale, basis_q, basis_scale, coord_q, "
                    "coord_scale, radius_q, radius_scale) or 11 (and lo_q, hi_q, extent_scale: "
                    "the extent layout); got ",
                    s.size());
  static const char* const kNames[] = {
      "supers[0] (mu_q)",        "supers[1] (mu_scale)",     "supers[2] (basis_q)",
      "supers[3] (basis_scale)", "supers[4] (coord_q)",      "supers[5] (coord_scale)",
      "supers[6] (radius_q)",    "supers[7] (radius_scale)", "supers[8] (lo_q)",
      "supers[9] (hi_q)",        "supers[10] (extent_scale)"};
  require(s[0], kNames[0], at::kChar, 3);
  require(s[2], kNames[2], at::kByte, 4);
  require(s[4], kNames[4], at::kChar, 4);
  locks::SuperLayout l;
  l.num_slots = s[0].size(0);
  l.num_kv_heads = to_int(s[0].size(1), "supers: num_kv_heads");
  l.head_dim = to_int(s[0].size(2), "supers: head_dim");
  l.rank = to_int(s[2].size(2), "supers: rank");
  l.group_pages = to_int(s[4].size(2), "supers: group_pages");
  l.page_size = cache.page_size;
  l.extent = s.size() == 11;
  TORCH_CHECK_VALUE(l.num_kv_heads == cache.num_kv_heads && l.head_dim == cache.head_dim,
                    "supers: ", kNames[0], " ", s[0].sizes(), " does not match the cache (",
                    cache.num_kv_heads, " KV heads, head_dim ", cache.head_dim, ")");
  const int64_t n = l.num_slots, h = l.num_kv_heads, d = l.head_dim, r = l.rank, g = l.group_pages;
  auto check = [&](int i, at::ScalarType t, std::initializer_list<int64_t> want) {
    require(s[i], kNames[i], t, int64_t(want.size()));
    TORCH_CHECK_VALUE(s[i].sizes() == at::IntArrayRef(want), kNames[i], ": expected shape ",
                      at::IntArrayRef(want), ", got ", s[i].sizes());
  };
  check(1, at::kFloat, {n, h});
  check(2, at::kByte, {n, h, r, d / 2});
  check(3, at::kFloat, {n, h, r});
  check(4, at::kChar, {n, h, g, r});
  check(5, at::kFloat, {n, h, r});
  check(6, at::kByte, {n, h, g});
  check(7, at::kFloat, {n, h});
  locks::SuperView v;
  v.layout = l;
  v.mu_q = s[0].data_ptr<int8_t>();
  v.mu_scale = s[1].data_ptr<float>();
  v.basis_q = s[2].data_ptr<uint8_t>();
  v.basis_scale = s[3].data_ptr<float>();
  v.coord_q = s[4].data_ptr<int8_t>();
  v.coord_scale = s[5].data_ptr<float>();
  v.radius_q = s[6].data_ptr<uint8_t>();
  v.radius_scale = s[7].data_ptr<float>();
  if (l.extent) {
    check(8, at::kChar, {n, h, g, r});
    check(9, at::kChar, {n, h, g, r});
    check(10, at::kFloat, {n, h, r});
    v.lo_q = s[8].data_ptr<int8_t>();
    v.hi_q = s[9].data_ptr<int8_t>();
    v.extent_scale = s[10].data_ptr<float>();
  }
  return v;
}

// super_table [batch, max_groups] int32: the slot of group j of sequence b.
inline locks::SuperTableView super_table_view(const at::Tensor& t) {
  require(t, "super_table", at::kInt, 2);
  return {t.data_ptr<int32_t>(), t.size(1), to_int(t.size(1), "super_table.size(1)")};
}

}  // namespace locks_torch
