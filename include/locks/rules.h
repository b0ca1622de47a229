// The budget rules of select.h as constexpr functions usable from host and device code (the
// CPU selection, the CUDA kernels and the plan all call these; Python asks C++ through the
// bindings). No dependencies beyond <cstdint>, so kernels can include it.
//
// Budget b tokens, page size P, a sequence of len tokens:
//   budget_pages = floor(b / P) page slots, of which sink + recent + 1 (the tail) are
//   reserved, so a budget is valid only when floor(b / P) >= sink + recent + 1;
//   b >= len selects every page (exact attention), and so does len < dense_below (a minimum
//   context below which decode stays exact; 0 = off);
//   capacity (slots to allocate per (sequence, KV head)) = min(max(ceil(b / P),
//   ceil((dense_below - 1) / P)), max_blocks): floor(b / P) pages when b < len, every page
//   (ceil(len / P) <= ceil(b / P)) when b >= len, every page of the longest sequence below
//   dense_below.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LOCKS_HD __host__ __device__
#else
#define LOCKS_HD
#endif

namespace locks::rules {

// Pages of a sequence of len tokens (the last one partial when len % P != 0), and full pages.
LOCKS_HD constexpr int num_pages(int64_t len, int page_size) {
  return static_cast<int>((len + page_size - 1) / page_size);
}
LOCKS_HD constexpr int full_pages(int64_t len, int page_size) {
  return static_cast<int>(len / page_size);
}
// A sequence length read from device memory (untrusted, docs/bad_input.md): outside
// [1, max_blocks * page_size] (its block-table row) it counts as 0, a sequence with no page.
LOCKS_HD constexpr int trusted_len(int len, int max_blocks, int page_size) {
  return len >= 1 && len <= max_blocks * page_size ? len : 0;
}
// Its full pages. The test is written out again so that the division sits under it, where the
// length is known positive: a shift in the kernels (trusted_len(...) / P compiled to a signed
// division, two instructions more).
LOCKS_HD constexpr int trusted_full_pages(int len, int max_blocks, int page_size) {
  return len >= 1 && len <= max_blocks * page_size ? len / page_size : 0;
}
LOCKS_HD constexpr int64_t budget_pages(int64_t budget_tokens, int page_size) {
  return budget_tokens / page_size;
}
LOCKS_HD constexpr int64_t reserved_pages(int sink_pages, int recent_pages) {
  return int64_t(sink_pages) + recent_pages + 1;
}
// The budget rule of validate_select (select.h): non-negative counts and room for sink +
// recent + tail.
LOCKS_HD constexpr bool budget_valid(int64_t budget_tokens, int sink_pages, int recent_pages,
                                     int page_size) {
  return page_size >= 1 && budget_tokens >= 0 && sink_pages >= 0 && recent_pages >= 0 &&
         budget_pages(budget_tokens, page_size) >= reserved_pages(sink_pages, recent_pages);
}
LOCKS_HD constexpr bool selects_all(int64_t budget_tokens, int64_t len, int64_t dense_below) {
  return budget_tokens >= len || len < dense_below;
}
// The adaptive budget (select.h, docs/method.md): tau = 0 is the fixed budget, else tau in
// (0, 1]; NaN fails every comparison, so it is invalid too. floor_pages >= 0, and with
// tau > 0 at most the scored slots of the budget (the floor cannot exceed the ceiling).
LOCKS_HD constexpr bool tau_valid(float tau) { return tau == 0.0f || (tau > 0.0f && tau <= 1.0f); }
LOCKS_HD constexpr int64_t scored_slots(int64_t budget_tokens, int sink_pages, int recent_pages,
                                        int page_size) {
  return budget_pages(budget_tokens, page_size) - reserved_pages(sink_pages, recent_pages);
}
LOCKS_HD constexpr bool floor_valid(int floor_pages, int64_t budget_tokens, int sink_pages,
                                    int recent_pages, int page_size) {
  return floor_pages >= 0 &&
         floor_pages <= scored_slots(budget_tokens, sink_pages, recent_pages, page_size);
}
// How many of the top-scored candidate pages the adaptive budget keeps: the fewest m in
// [min(floor, hi), hi] with covered(m) >= tau * total, else hi (hi = the pages the fixed
// budget would take by score). covered(m): the estimated mass of the always-attended full
// pages plus the m best-scored candidates, total: of every full page, both shifted by the
// same constant. covered is non-decreasing in m, so a binary search finds m with
// O(log hi) calls; on CUDA covered() is a block-wide reduction, called by every thread.
// A NaN mass (a total that is not finite) fails every comparison: the fixed budget.
template <typename CoveredFn>
LOCKS_HD constexpr int adaptive_pages(int floor_pages, int hi, float tau, double total,
                                      CoveredFn covered) {
  int lo = floor_pages < hi ? floor_pages : hi;
  const double target = double(tau) * total;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (covered(mid) >= target)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Slots per (sequence, KV head): min(max(ceil(b / P), ceil((dense_below - 1) / P)),
// max_blocks_per_seq). The second term holds every page of a sequence of dense_below - 1
// tokens, the longest one selects_all keeps whole below the minimum context.
LOCKS_HD constexpr int select_capacity(int64_t budget_tokens, int page_size, int max_blocks_per_seq,
                                       int64_t dense_below) {
  const int64_t by_budget = (budget_tokens + page_size - 1) / page_size;
  const int64_t by_dense = dense_below > 1 ? (dense_below - 1 + page_size - 1) / page_size : 0;
  const int64_t pages = by_budget > by_dense ? by_budget : by_dense;
  return static_cast<int>(pages < max_blocks_per_seq ? pages : max_blocks_per_seq);
}
// Pages the last `appended` tokens completed for a sequence now len tokens long: the index
// of the completed page, or -1 (at most one page for 1 <= appended <= P).
LOCKS_HD constexpr int filled_page(int64_t len, int appended, int page_size) {
  const int64_t before = len - appended > 0 ? len - appended : 0;
  return (len / page_size != before / page_size) ? static_cast<int>(len / page_size - 1) : -1;
}
// Block completed by writing slot (vLLM slot = block * P + offset; negative = padding):
// the block when the slot is its last one (offset P - 1), else -1.
LOCKS_HD constexpr int64_t slot_filled_block(int64_t slot, int page_size) {
  return (slot >= 0 && slot % page_size == page_size - 1) ? slot / page_size : -1;
}

// Request rows (request_rows.h): the last page of a sequence of len tokens (-1 for len < 1);
// where a token row puts page p of its request's list (its own last page row_last, the
// request's req_last): 0 = before the row's own last page (p <= row_last), 2 = after it (p past
// both: an invalid entry, passed on), 1 = dropped (row_last < p <= req_last).
LOCKS_HD constexpr int last_page(int64_t len, int page_size) {
  return len >= 1 ? static_cast<int>((len - 1) / page_size) : -1;
}
LOCKS_HD constexpr int request_row_part(int page, int row_last, int req_last) {
  return page <= row_last ? 0 : page > req_last ? 2 : 1;
}

static_assert(select_capacity(20, 16, 100, 0) == 2, "b = 20, P = 16 needs 2 slots");
static_assert(select_capacity(64, 16, 300, 4097) == 256 &&
                  select_capacity(64, 16, 300, 4098) == 257,
              "4096 tokens (below 4097) fill 256 pages, 4097 tokens 257");
static_assert(select_capacity(64, 16, 100, 65) == 4 && select_capacity(64, 16, 10, 9999) == 10,
              "dense_below <= b + 1 changes nothing; max_blocks caps");
static_assert(selects_all(64, 100, 101) && !selects_all(64, 101, 101) && selects_all(64, 64, 0),
              "dense below 101 tokens; b >= len dense anyway");
static_assert(budget_valid(16, 0, 0, 16) && !budget_valid(15, 0, 0, 16), "one page at least");
static_assert(tau_valid(0.0f) && tau_valid(1.0f) && !tau_valid(-0.5f) && !tau_valid(1.5f),
              "tau in {0} u (0, 1]");
static_assert(adaptive_pages(1, 5, 0.5f, 1.0, [](int m) { return 0.2 * m; }) == 3, "0.6 >= 0.5");
static_assert(adaptive_pages(4, 5, 0.1f, 1.0, [](int m) { return 0.2 * m; }) == 4, "the floor");
static_assert(filled_page(16, 1, 16) == 0 && filled_page(17, 1, 16) == -1, "page 0 fills at 16");
static_assert(slot_filled_block(31, 16) == 1 && slot_filled_block(-1, 16) == -1, "slot rule");
static_assert(last_page(16, 16) == 0 && last_page(17, 16) == 1 && last_page(0, 16) == -1,
              "last page");
static_assert(request_row_part(3, 3, 4) == 0 && request_row_part(4, 3, 4) == 1 &&
                  request_row_part(5, 3, 4) == 2 && request_row_part(-1, 3, 4) == 0,
              "row parts");

}  // namespace locks::rules
