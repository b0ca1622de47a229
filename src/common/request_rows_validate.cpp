// validate_request_rows (include/locks/request_rows.h): the host checks of every backend.
#include <cstdint>
#include <limits>

#include "locks/error.h"
#include "locks/request_rows.h"

namespace locks {

void validate_request_rows(const RequestRows& rows, const Selection& req, const Selection& out,
                           int num_kv_heads, int page_size) {
  LOCKS_REQUIRE(rows.num_requests >= 1, "request_rows: num_requests must be >= 1, got ",
                rows.num_requests);
  LOCKS_REQUIRE(rows.tokens_per_request >= 1, "request_rows: tokens_per_request must be >= 1, got ",
                rows.tokens_per_request);
  LOCKS_REQUIRE(
      int64_t(rows.num_requests) * rows.tokens_per_request <= std::numeric_limits<int>::max(),
      "request_rows: ", rows.num_requests, " requests x ", rows.tokens_per_request,
      " tokens overflow int");
  LOCKS_REQUIRE(rows.req_seq_lens != nullptr && rows.row_seq_lens != nullptr,
                "request_rows: req_seq_lens / row_seq_lens are null");
  LOCKS_REQUIRE(num_kv_heads >= 1, "request_rows: num_kv_heads must be >= 1, got ", num_kv_heads);
  LOCKS_REQUIRE(page_size >= 1, "request_rows: page_size must be >= 1, got ", page_size);
  LOCKS_REQUIRE(req.pages != nullptr && req.counts != nullptr && out.pages != nullptr &&
                    out.counts != nullptr,
                "request_rows: selection arrays are null");
  LOCKS_REQUIRE(req.capacity >= 1,
                "request_rows: the request selection's capacity must be >= 1, got ", req.capacity);
  LOCKS_REQUIRE(out.capacity >= req.capacity, "request_rows: the rows' capacity ", out.capacity,
                " is below the request selection's ", req.capacity);
  // The rows are written while the requests' lists are read: the arrays must not overlap.
  const int64_t S = rows.num_requests, H = num_kv_heads;
  const int64_t rows_n = S * rows.tokens_per_request;
  auto apart = [](const int32_t* a, int64_t na, const int32_t* b, int64_t nb) {
    const auto ua = reinterpret_cast<uintptr_t>(a), ub = reinterpret_cast<uintptr_t>(b);
    return ua + uint64_t(na) * 4 <= ub || ub + uint64_t(nb) * 4 <= ua;
  };
  const int32_t* in[2] = {req.pages, req.counts};
  const int64_t in_n[2] = {S * H * req.capacity, S * H};
  for (int i = 0; i < 2; ++i)
    LOCKS_REQUIRE(apart(in[i], in_n[i], out.pages, rows_n * H * out.capacity) &&
                      apart(in[i], in_n[i], out.counts, rows_n * H),
                  "request_rows: the rows' selection overlaps the requests' (write into other "
                  "buffers)");
}

}  // namespace locks
