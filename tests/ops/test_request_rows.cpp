// request_rows (include/locks/request_rows.h) on the backend of this binary (tests/ops: CPU;
// tests/cuda: CUDA) against the reference's statement of the rule, entry for entry: valid
// verification batches (the requests' selections in select.h's form, T tokens a request, rows
// that straddle a page end, dense lists, 1-page lists, lists longer than a warp's 32 entries),
// the rule's properties checked on their own, device values the CUDA kernel must survive
// (which the CPU refuses, writing nothing), and the host checks of every backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "locks/error.h"
#include "locks/reference.h"
#include "locks/request_rows.h"
#include "locks/rules.h"
#include "test_util.h"

namespace locks::test {
namespace {

constexpr int kP = 16;

// A verification batch on the host: S requests x T rows, H KV heads, the requests' selections.
struct Batch {
  int S = 0, T = 0, H = 0, cap = 0;
  std::vector<int32_t> req_lens, row_lens, pages, counts;  // pages [S, H, cap], counts [S, H]
};

// Requests whose last token ends at a random length; each selects at that length, less one
// where it completes a page (the vLLM plugin's rule), a random ascending subset of its pages of
// at most `cap` that always holds its (partial) last page; rows end at the request's last
// token, T - 1 - t tokens before it.
Batch valid_batch(int S, int T, int H, int cap, int max_len, uint64_t seed) {
  Rng rng(seed);
  Batch b{S, T, H, cap, {}, {}, {}, {}};
  b.pages.assign(size_t(S) * H * cap, -1);
  b.counts.assign(size_t(S) * H, 0);
  for (int s = 0; s < S; ++s) {
    const int last = rng.integer(T + 1, max_len);  // the last token's length
    const int req = last % kP == 0 ? last - 1 : last;
    b.req_lens.push_back(req);
    for (int t = 0; t < T; ++t) b.row_lens.push_back(last - (T - 1 - t));
    const int n = rules::num_pages(req, kP), tail = n - 1;
    for (int h = 0; h < H; ++h) {
      std::vector<int32_t> pick;
      for (int p = 0; p < tail; ++p) pick.push_back(p);
      std::shuffle(pick.begin(), pick.end(), rng.engine());
      // 0 to cap - 1 scored pages besides the tail (a dense list when the request is short)
      const int k = std::min<int>(int(pick.size()), rng.integer(0, cap - 1));
      pick.resize(size_t(k));
      pick.push_back(tail);
      std::sort(pick.begin(), pick.end());
      std::copy(pick.begin(), pick.end(), &b.pages[(size_t(s) * H + h) * cap]);
      b.counts[size_t(s) * H + h] = int32_t(pick.size());
    }
  }
  return b;
}

struct Out {
  std::vector<int32_t> pages, counts;
};

class RequestRowsOnBackend : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = make_backend();
    const std::string why = be_->unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  bool cpu() const { return be_->kind() == Backend::cpu; }

  // The backend's rows (out_cap slots a row; outputs pre-filled with 0x7f bytes so that a call
  // that writes nothing shows).
  Out run(const Batch& b, int out_cap) {
    const size_t rows = size_t(b.S) * b.T;
    auto put = [&](const std::vector<int32_t>& v) {
      void* p = be_->alloc(std::max<size_t>(v.size(), 1) * 4);
      be_->put(p, v.data(), v.size() * 4);
      return mem_.emplace_back(p, be_.get()), static_cast<int32_t*>(p);
    };
    auto out = [&](size_t n) {
      void* p = be_->alloc(n * 4);
      be_->fill(p, 0x7f, n * 4);
      return mem_.emplace_back(p, be_.get()), static_cast<int32_t*>(p);
    };
    int32_t* op = out(rows * b.H * out_cap);
    int32_t* oc = out(rows * b.H);
    const RequestRows rr{put(b.req_lens), put(b.row_lens), b.S, b.T};
    be_->request_rows(rr, {put(b.pages), put(b.counts), b.cap}, b.H, kP, {op, oc, out_cap});
    be_->finish();
    Out o{std::vector<int32_t>(rows * b.H * out_cap), std::vector<int32_t>(rows * b.H)};
    be_->get(o.pages.data(), op, o.pages.size() * 4);
    be_->get(o.counts.data(), oc, o.counts.size() * 4);
    return o;
  }
  static Out reference(Batch b, int out_cap) {
    const size_t rows = size_t(b.S) * b.T;
    Out o{std::vector<int32_t>(rows * b.H * out_cap), std::vector<int32_t>(rows * b.H)};
    ref::request_rows({b.req_lens.data(), b.row_lens.data(), b.S, b.T},
                      {b.pages.data(), b.counts.data(), b.cap}, b.H, kP,
                      {o.pages.data(), o.counts.data(), out_cap});
    return o;
  }

  struct Mem {
    void* p;
    OpsBackend* be;
    Mem(void* q, OpsBackend* b) : p(q), be(b) {}
    Mem(Mem&& m) noexcept : p(m.p), be(m.be) { m.p = nullptr; }
    ~Mem() {
      if (p) be->free(p);
    }
  };
  std::unique_ptr<OpsBackend> be_;
  std::vector<Mem> mem_;
};

// The rule's properties, independent of the reference: each row's list is ascending, holds its
// own last page, none past it, and otherwise only pages of its request's list; a row sharing
// its request's last page gets the request's list unchanged.
void expect_rule(const Batch& b, const Out& o, int out_cap) {
  for (int r = 0; r < b.S * b.T; ++r) {
    const int s = r / b.T, own = (b.row_lens[size_t(r)] - 1) / kP;
    const int req_last = (b.req_lens[size_t(s)] - 1) / kP;
    for (int h = 0; h < b.H; ++h) {
      const int32_t* in = &b.pages[(size_t(s) * b.H + h) * b.cap];
      const int cin = b.counts[size_t(s) * b.H + h];
      const int32_t* got = &o.pages[(size_t(r) * b.H + h) * out_cap];
      const int n = o.counts[size_t(r) * b.H + h];
      ASSERT_GE(n, 1) << "row " << r;
      ASSERT_TRUE(std::is_sorted(got, got + n) && std::adjacent_find(got, got + n) == got + n);
      ASSERT_EQ(got[n - 1], own) << "row " << r << " ends with its own last page";
      for (int i = 0; i < n - 1; ++i) ASSERT_NE(std::find(in, in + cin, got[i]), in + cin);
      for (int i = n; i < out_cap; ++i) ASSERT_EQ(got[i], -1) << "padding";
      if (own == req_last) {
        ASSERT_EQ(n, cin);
        ASSERT_TRUE(std::equal(in, in + cin, got));
      }
    }
  }
}

TEST_F(RequestRowsOnBackend, ValidBatchesMatchTheReference) {
  struct Case {
    int S, T, H, cap, max_len;
  };
  // T 1 (no straddling), 4 (a speculative k of 3), 16 (T = P); capacities of 1 page, a budget's
  // 8, 40 (more than a warp's 32 entries) and every page of the requests (dense lists).
  for (const Case c : {Case{5, 1, 2, 8, 600}, Case{6, 4, 2, 8, 600}, Case{3, 4, 8, 1, 100},
                       Case{7, 4, 1, 40, 2000}, Case{4, 16, 2, 40, 1000}, Case{3, 4, 3, 64, 1024}})
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE("S " + std::to_string(c.S) + " T " + std::to_string(c.T) + " cap " +
                   std::to_string(c.cap) + " seed " + std::to_string(seed));
      const Batch b = valid_batch(c.S, c.T, c.H, c.cap, c.max_len, seed * 97 + c.T);
      for (int out_cap : {c.cap, c.cap + 3}) {
        const Out got = run(b, out_cap), want = reference(b, out_cap);
        EXPECT_EQ(got.counts, want.counts);
        EXPECT_EQ(got.pages, want.pages);
        expect_rule(b, got, out_cap);
      }
    }
}

// Two requests of T 4 written out. Request 0's last token (48) completes page 2, so it selected
// at 47 tokens: its rows of 45-48 tokens all end on page 2 and keep its lists as they are.
// Request 1 selected at 34 tokens (page 2 partial): its rows of 33 and 34 tokens end on page 2
// too, those of 31 and 32 straddle: page 2 of the list becomes their page 1, or goes where
// page 1 is already listed.
TEST_F(RequestRowsOnBackend, StraddlingRowsSwapOrDropTheRequestsLastPage) {
  Batch b{2, 4, 2, 3, {47, 34}, {45, 46, 47, 48, 31, 32, 33, 34}, {}, {}};
  b.pages = {0, 2, -1, /**/ 0, 1, 2, /**/ 1, 2, -1, /**/ 2, -1, -1};
  b.counts = {2, 3, 2, 1};
  const Out o = run(b, 3);
  auto row = [&](int r, int h) {
    const int n = o.counts[size_t(r) * 2 + h];
    return std::vector<int32_t>(&o.pages[(size_t(r) * 2 + h) * 3],
                                &o.pages[(size_t(r) * 2 + h) * 3] + std::max(n, 0));
  };
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(row(r, 0), (std::vector<int32_t>{0, 2})) << "row " << r;
    EXPECT_EQ(row(r, 1), (std::vector<int32_t>{0, 1, 2})) << "row " << r;
  }
  // request 1 selected at 34 tokens (page 2 partial): rows of 31 and 32 tokens end on page 1
  EXPECT_EQ(row(4, 0), (std::vector<int32_t>{1}));  // page 1 listed: page 2 goes
  EXPECT_EQ(row(4, 1), (std::vector<int32_t>{1}));  // page 2 becomes page 1
  EXPECT_EQ(row(5, 0), (std::vector<int32_t>{1}));
  EXPECT_EQ(row(6, 0), (std::vector<int32_t>{1, 2}));  // 33 tokens: page 2 is theirs
  EXPECT_EQ(row(7, 1), (std::vector<int32_t>{2}));
  EXPECT_EQ(o.pages[(size_t(4) * 2 + 0) * 3 + 1], -1) << "the dropped entry is padding";
  const Out want = reference(b, 3);
  EXPECT_EQ(o.pages, want.pages);
  EXPECT_EQ(o.counts, want.counts);
}

// Device values outside the contract: a count outside [0, capacity], a row of length 0, a page
// index past the request, a request of length 0, a partial last page missing from a full list.
// The CUDA kernel writes the reference's rows (count -1 where invalid, 0 for an empty row) and
// does not fault; the CPU refuses each call before writing anything.
TEST_F(RequestRowsOnBackend, BadDeviceValuesAreDefinedOnCudaAndRefusedOnCpu) {
  const Batch good = valid_batch(3, 4, 2, 4, 300, 11);
  std::vector<Batch> bad(6, good);
  bad[0].counts[1] = 5;   // > capacity
  bad[1].counts[2] = -2;  // < 0
  bad[2].row_lens[5] = 0;
  bad[3].pages[0] = 1000;  // past the request: kept after the row's own page
  bad[4].req_lens[1] = 0;
  // request 0 selected at a full page (32 tokens) without page 1 in a full list (pages 0 only,
  // capacity 1): rows of 31 tokens need their partial page 1
  bad[5] = Batch{1, 2, 1, 1, {32}, {31, 32}, {0}, {1}};
  for (size_t i = 0; i < bad.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    const Batch& b = bad[i];
    if (cpu()) {
      EXPECT_THROW(run(b, b.cap), InvalidArgument);
      continue;
    }
    const Out got = run(b, b.cap), want = reference(b, b.cap);
    EXPECT_EQ(got.counts, want.counts);
    EXPECT_EQ(got.pages, want.pages);
  }
  if (!cpu())  // 31 tokens: invalid; 32 (its last page full): the request's list as it is
    EXPECT_EQ(run(bad[5], 1).counts, (std::vector<int32_t>{-1, 1}));
}

// The CPU writes nothing on a refused call: its outputs keep their fill.
TEST_F(RequestRowsOnBackend, ARefusedCallWritesNothing) {
  if (!cpu()) GTEST_SKIP() << "the CUDA kernel takes device values as they are";
  Batch b = valid_batch(2, 4, 2, 4, 300, 5);
  b.row_lens.back() = b.req_lens.back() + kP;  // ends past its request's last page
  std::vector<int32_t> pages(size_t(8) * 2 * 4, 77), counts(size_t(8) * 2, 77);
  EXPECT_THROW(be_->request_rows({b.req_lens.data(), b.row_lens.data(), 2, 4},
                                 {b.pages.data(), b.counts.data(), 4}, 2, kP,
                                 {pages.data(), counts.data(), 4}),
               InvalidArgument);
  EXPECT_TRUE(std::all_of(pages.begin(), pages.end(), [](int32_t v) { return v == 77; }));
  EXPECT_TRUE(std::all_of(counts.begin(), counts.end(), [](int32_t v) { return v == 77; }));
}

// Host checks of every backend (validate_request_rows), before any launch.
TEST_F(RequestRowsOnBackend, BadCallsAreRefused) {
  Batch b = valid_batch(2, 4, 2, 4, 300, 3);
  std::vector<int32_t> big(64 * 8, 0), cnt(64, 0);
  const int32_t* lens = b.req_lens.data();
  const RequestRows ok{lens, b.row_lens.data(), 2, 4};
  const Selection req{b.pages.data(), b.counts.data(), 4};
  const Selection out{big.data(), cnt.data(), 4};
  auto call = [&](RequestRows rr, Selection q, int H, int P, Selection o) {
    be_->request_rows(rr, q, H, P, o);
  };
  EXPECT_THROW(call({lens, b.row_lens.data(), 0, 4}, req, 2, kP, out), InvalidArgument);
  EXPECT_THROW(call({lens, b.row_lens.data(), 2, 0}, req, 2, kP, out), InvalidArgument);
  EXPECT_THROW(call({nullptr, b.row_lens.data(), 2, 4}, req, 2, kP, out), InvalidArgument);
  EXPECT_THROW(call({lens, b.row_lens.data(), 1 << 16, 1 << 16}, req, 2, kP, out), InvalidArgument);
  EXPECT_THROW(call(ok, req, 0, kP, out), InvalidArgument);
  EXPECT_THROW(call(ok, req, 2, 0, out), InvalidArgument);
  EXPECT_THROW(call(ok, {req.pages, req.counts, 0}, 2, kP, out), InvalidArgument);
  EXPECT_THROW(call(ok, req, 2, kP, {big.data(), cnt.data(), 3}), InvalidArgument);
  EXPECT_THROW(call(ok, req, 2, kP, {nullptr, cnt.data(), 4}), InvalidArgument);
  // writing over the requests' own lists
  EXPECT_THROW(call(ok, req, 2, kP, {req.pages, cnt.data(), 4}), InvalidArgument);
  EXPECT_THROW(call(ok, req, 2, kP, {big.data(), req.counts, 4}), InvalidArgument);
  EXPECT_TRUE(std::all_of(big.begin(), big.end(), [](int32_t v) { return v == 0; }));
}

}  // namespace
}  // namespace locks::test
