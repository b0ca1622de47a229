// One page selection per request, handed to each of its token rows: speculative verification
// (vLLM's spec_selection "request", docs/vllm.md). A verification batch holds T token rows
// per request (row r = s T + t of request s, lengths ending at the request's); the request
// selects once, from all its tokens' queries, at length req_seq_lens[s], and every token
// row then attends over that selection cut to its own length:
//
//   row r of length len (own last page l = (len - 1) / P), request s selected at req_len
//   (last page R = (req_len - 1) / P):
//     1. the request's pages p <= l, in their order;
//     2. l itself if the list lacks it and has room (a row always attends its own last page
//        where it can; its partial last page must be there: see below);
//     3. the request's pages p > R, in their order (none in a valid selection: only invalid
//        device values, passed on for the attention to refuse, docs/bad_input.md);
//   pages in (l, R] are dropped (they lie past the row: at T <= P the request's last page).
//   The list stays ascending and -1 padded to out.capacity; counts[r][h] its length.
//
// When a request selects at a length whose last page is partial (the vLLM plugin selects at
// one token less where its last token completes a page), that page is always in its list, so
// a row either shares it or drops it for its own: the room of step 2 is always there. A row
// whose partial last page is missing with no room left (a request selected where its last
// page was full and unselected) is invalid: the CPU refuses the call, the CUDA kernel writes
// count -1 (the attention then writes NaN rows for it). A row of length < 1 gets no pages.
#pragma once

#include <cstdint>

#include "locks/select.h"

namespace locks {

struct RequestRows {
  const int32_t* req_seq_lens = nullptr;  // [num_requests]: the length each request selected at
  const int32_t* row_seq_lens = nullptr;  // [num_requests * tokens_per_request]: each row's
  int num_requests = 0;
  int tokens_per_request = 0;  // T >= 1
};

// Host checks shared by every backend: num_requests >= 1, tokens_per_request >= 1, the
// product fits int, both length arrays non-null, num_kv_heads >= 1, page_size >= 1, both
// selections' arrays non-null, 1 <= req.capacity <= out.capacity, out's arrays apart from req's.
// Throws InvalidArgument.
void validate_request_rows(const RequestRows& rows, const Selection& req, const Selection& out,
                           int num_kv_heads, int page_size);

}  // namespace locks
