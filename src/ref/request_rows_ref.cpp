// ref::request_rows (include/locks/reference.h): the rule of request_rows.h on vectors, with
// no shared code beyond the contract's structs, so that both backends are checked against an
// independent statement of it.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "locks/reference.h"

namespace locks::ref {

void request_rows(const RequestRows& rows, const Selection& req, int num_kv_heads, int page_size,
                  const Selection& out) {
  const int H = num_kv_heads, T = rows.tokens_per_request;
  for (int r = 0; r < rows.num_requests * T; ++r) {
    const int s = r / T, len = rows.row_seq_lens[r], req_len = rows.req_seq_lens[s];
    for (int h = 0; h < H; ++h) {
      const int64_t sh = int64_t(s) * H + h, rh = int64_t(r) * H + h;
      const int count = req.counts[sh];
      std::vector<int32_t> list;
      bool valid = count >= 0 && count <= req.capacity;
      if (len >= 1 && valid) {
        const std::vector<int32_t> in(req.pages + sh * req.capacity,
                                      req.pages + sh * req.capacity + count);
        // floor division written out (len, req_len >= 1 here; req_len < 1: no page is past it)
        const int own = (len - 1) / page_size;
        const int req_last = req_len >= 1 ? (req_len - 1) / page_size : -1;
        std::vector<int32_t> after;
        for (int32_t p : in) {
          if (p <= own)
            list.push_back(p);
          else if (p > req_last)
            after.push_back(p);
        }
        const bool has_own = std::find(in.begin(), in.end(), own) != in.end();
        const bool room = int(list.size() + after.size()) < out.capacity;
        if (!has_own && room) list.push_back(own);
        if (!has_own && !room && len % page_size != 0) valid = false;
        list.insert(list.end(), after.begin(), after.end());
      }
      int32_t* o = out.pages + rh * out.capacity;
      std::fill(o, o + out.capacity, -1);
      if (len >= 1 && !valid) {
        out.counts[rh] = -1;
        continue;
      }
      std::copy(list.begin(), list.end(), o);
      out.counts[rh] = int32_t(list.size());
    }
  }
}

}  // namespace locks::ref
