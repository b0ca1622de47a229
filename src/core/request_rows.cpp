// cpu::request_rows (include/locks/request_rows.h): each token row's list from its request's
// selection. Host data, so every value is checked first and a bad call writes nothing.
#include "locks/request_rows.h"

#include <cstdint>

#include "internal/check.h"
#include "locks/contract.h"
#include "locks/error.h"
#include "locks/rules.h"

namespace locks::cpu {
namespace {

constexpr const char* kWhere = "request_rows";

// What a row keeps of its request's list (request_rows.h's steps 1-3): the entries kept, whether
// its own last page is added (missing, with room), or missing for want of room.
struct RowPlan {
  int kept = 0;
  bool add_last = false, last_missing = false;
};
RowPlan row_plan(const int32_t* pages, int count, int row_last, int req_last, int capacity) {
  RowPlan p;
  bool has_last = false;
  for (int i = 0; i < count; ++i) {
    p.kept += rules::request_row_part(pages[i], row_last, req_last) != 1;
    has_last |= pages[i] == row_last;
  }
  p.add_last = !has_last && p.kept < capacity;
  p.last_missing = !has_last && !p.add_last;
  return p;
}

}  // namespace

void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out) {
  validate_request_rows(rows, req, out, num_kv_heads, page_size);
  const int S = rows.num_requests, T = rows.tokens_per_request, H = num_kv_heads;
  for (int s = 0; s < S; ++s)
    LOCKS_REQUIRE(rows.req_seq_lens[s] >= 1, kWhere, ": req_seq_lens[", s,
                  "] = ", rows.req_seq_lens[s], " must be >= 1");
  BatchView reqs;
  reqs.seq_lens = rows.req_seq_lens;
  reqs.batch_size = S;
  detail::check_selection(req, reqs, H, page_size, kWhere);
  // Every row first: a call that fails writes nothing.
  for (int r = 0; r < S * T; ++r) {
    const int s = r / T, len = rows.row_seq_lens[r];
    const int row_last = rules::last_page(len, page_size);
    const int req_last = rules::last_page(rows.req_seq_lens[s], page_size);
    LOCKS_REQUIRE(len >= 1, kWhere, ": row_seq_lens[", r, "] = ", len, " must be >= 1");
    LOCKS_REQUIRE(row_last <= req_last, kWhere, ": row ", r, " (", len,
                  " tokens) ends past the last page of request ", s, " (selected at ",
                  rows.req_seq_lens[s], " tokens)");
    for (int h = 0; h < H; ++h) {
      const int64_t sh = int64_t(s) * H + h;
      const RowPlan c =
          row_plan(req.pages + sh * req.capacity, req.counts[sh], row_last, req_last, out.capacity);
      LOCKS_REQUIRE(!c.last_missing || len % page_size == 0, kWhere, ": row ", r, " (", len,
                    " tokens), KV head ", h, ": its partial last page ", row_last,
                    " is not in request ", s,
                    "'s full selection (select the request at a length "
                    "whose last page is partial)");
    }
  }
  for (int r = 0; r < S * T; ++r) {
    const int s = r / T;
    const int row_last = rules::last_page(rows.row_seq_lens[r], page_size);
    const int req_last = rules::last_page(rows.req_seq_lens[s], page_size);
    for (int h = 0; h < H; ++h) {
      const int64_t sh = int64_t(s) * H + h, rh = int64_t(r) * H + h;
      const int32_t* in = req.pages + sh * req.capacity;
      const int count = req.counts[sh];
      int32_t* o = out.pages + rh * out.capacity;
      const RowPlan c = row_plan(in, count, row_last, req_last, out.capacity);
      int n = 0;
      for (int i = 0; i < count; ++i)
        if (rules::request_row_part(in[i], row_last, req_last) == 0) o[n++] = in[i];
      if (c.add_last) o[n++] = row_last;
      for (int i = 0; i < count; ++i)
        if (rules::request_row_part(in[i], row_last, req_last) == 2) o[n++] = in[i];
      for (int i = n; i < out.capacity; ++i) o[i] = -1;
      out.counts[rh] = n;
    }
  }
}

}  // namespace locks::cpu
