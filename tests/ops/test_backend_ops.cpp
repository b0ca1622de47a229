// The cross-backend op suite: every op of the contract (contract.h) on the backend of this
// binary (tests/ops: CPU; tests/cuda: CUDA) against the float64 reference, over cache
// dtypes, head_dims, page sizes, GQA groups, summary precisions, ragged lengths and budgets
// from one page to the whole context, within the derived bounds of test_compare.h (plus
// the backend's ArithModel). Cases a backend does not support (supports()) are skipped
// with the reason; so is every case when the backend is unavailable (no GPU). Some cases
// put K/V in backend memory with a block stride (kv_cache.h): vLLM's V1 model runner's
// interleaved [N, 2, P, H, d] cache, or blocks with NaN padding between them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "backend.h"
#include "locks/cuda/limits.h"
#include "locks/reference.h"
#include "locks/rules.h"
#include "test_compare.h"
#include "test_util.h"

namespace locks::test {
namespace {

// Where the case's K/V blocks sit in backend memory (KvCacheView::block_stride).
enum class KvMem {
  dense,        // two arrays [N, P, H, d]
  interleaved,  // one [N, 2, P, H, d] array, K = kv[:, 0], V = kv[:, 1]: block stride 2E
  padded,       // two arrays, blocks E + kPad apart, the gaps NaN (a read of them shows)
};
constexpr int64_t kPad = 64;  // elements: blocks stay 16-byte aligned in every dtype

struct OpCase {
  DType dtype;
  int head_dim, page_size, kv_heads, group, rank;
  Precision precision;
  std::vector<int32_t> lens;
  bool structured = false;
  bool weighted = false;  // query-weighted summaries (summary.h: SummaryView::qweight)
  int basis_group = 0;    // dims per int4 basis scale; 0 = summary_layout_for's default
  KvMem kv = KvMem::dense;
};

std::string name_of(const OpCase& c) {
  std::ostringstream os;
  os << dtype_name(c.dtype) << "_d" << c.head_dim << "_P" << c.page_size << "_H" << c.kv_heads
     << "_G" << c.group << "_r" << c.rank << "_" << precision_name(c.precision) << "_B"
     << c.lens.size() << (c.weighted ? "_wq" : "")
     << (c.basis_group ? "_g" + std::to_string(c.basis_group) : "")
     << (c.kv == KvMem::interleaved ? "_kvi"
         : c.kv == KvMem::padded    ? "_pad"
                                    : "");
  return os.str();
}

void PrintTo(const OpCase& c, std::ostream* os) { *os << name_of(c); }

std::vector<OpCase> cases() {
  using P = Precision;
  return {
      {DType::bf16, 128, 16, 2, 4, 8, P::quant, {37, 16, 200, 513}, true},
      {DType::bf16, 128, 16, 1, 16, 8, P::quant, {300}},
      {DType::f16, 64, 16, 2, 1, 4, P::fp32, {100, 33}},
      {DType::f16, 128, 16, 4, 2, 4, P::quant, {1, 15, 17, 160}},
      {DType::bf16, 64, 16, 2, 8, 8, P::fp32, {64, 250}, true},
      {DType::f32, 64, 16, 1, 8, 8, P::quant, {257, 64}},
      {DType::bf16, 64, 8, 2, 2, 4, P::fp32, {41, 8}},
      {DType::f32, 32, 4, 3, 1, 2, P::quant, {9, 22, 4}},
      {DType::bf16, 256, 16, 1, 2, 8, P::fp32, {70, 48}},
      {DType::f16, 96, 32, 2, 3, 6, P::quant, {95, 64}},
      // Head dims outside the CUDA kernels' table (the CPU path takes every even d in [8, 512]):
      // Phi-2 / StableLM's 80, a 48, a d that is no multiple of 4, the largest, and 80 with
      // int4 basis scales per 16 dims.
      {DType::bf16, 80, 16, 2, 4, 8, P::quant, {37, 200}, true},
      {DType::f16, 80, 16, 1, 2, 8, P::quant, {100, 33}, false, true},
      {DType::f32, 48, 16, 2, 3, 8, P::fp32, {64, 90}},
      {DType::bf16, 10, 8, 1, 2, 4, P::quant, {41, 8}},
      {DType::bf16, 512, 16, 1, 2, 8, P::quant, {70}},
      {DType::bf16, 80, 16, 1, 2, 8, P::quant, {64, 33}, false, false, 16},
      // Query-weighted summaries: the G 4 hi/lo and G 8 rounded-once tensor-core paths, d 256
      // (Gemma-3's global layers), and the CUDA-core path (fp32 summaries).
      {DType::bf16, 128, 16, 2, 4, 8, P::quant, {37, 16, 200, 513}, true, true},
      {DType::bf16, 128, 16, 1, 8, 8, P::quant, {300, 48}, false, true},
      {DType::bf16, 256, 16, 1, 4, 8, P::quant, {300, 70}, true, true},
      {DType::f16, 64, 16, 2, 2, 8, P::fp32, {100, 33}, false, true},
      // Strided caches: the V1 runner's interleaved K/V (the GLM/Llama serving shapes and d
      // 256) and padded blocks (CUDA-core scoring, fp32 summaries, the CPU-only page size 4).
      {DType::bf16,
       128,
       16,
       2,
       4,
       8,
       P::quant,
       {37, 16, 200, 513},
       true,
       false,
       0,
       KvMem::interleaved},
      {DType::bf16, 128, 16, 1, 8, 8, P::quant, {300, 48}, false, false, 0, KvMem::interleaved},
      {DType::bf16, 256, 16, 1, 2, 8, P::fp32, {70, 48}, false, false, 0, KvMem::interleaved},
      {DType::f16, 64, 16, 2, 1, 4, P::fp32, {100, 33}, false, false, 0, KvMem::padded},
      {DType::f32, 32, 4, 3, 1, 2, P::quant, {9, 22, 4}, false, false, 0, KvMem::padded},
      // int4 basis scale groups (summary.h's basis_group): the default above is 32 dims at d 256
      // (the tensor-core kernel's grouped instances) and one scale a row at d <= 128. 32 at
      // d 128 (grouped instances: hi/lo G 4, rounded-once G 16), one a row at d 256, 32 at
      // d 64 and 16 at d 128 (the CUDA-core kernel), structured and random keys, with and
      // without query weights; d 256 G 8 takes two head slices.
      {DType::bf16, 128, 16, 2, 4, 8, P::quant, {37, 16, 200, 513}, true, false, 32},
      {DType::bf16, 128, 16, 1, 16, 8, P::quant, {300}, false, false, 32},
      {DType::bf16, 256, 16, 2, 2, 8, P::quant, {300, 70}, false, false, 256},
      {DType::bf16, 256, 16, 1, 4, 8, P::quant, {300, 70}, true, true, 256},
      {DType::bf16, 256, 16, 1, 4, 8, P::quant, {300, 70}, true},
      {DType::f16, 256, 16, 1, 8, 8, P::quant, {200, 33}, false, true},
      {DType::bf16, 64, 16, 2, 4, 8, P::quant, {257, 64}, true, false, 32},
      {DType::f16, 64, 16, 1, 8, 8, P::quant, {150}, false, true, 32},
      {DType::bf16, 128, 16, 2, 8, 8, P::quant, {300, 48}, true, false, 16},
  };
}

// Backend memory holding a copy of a host array.
struct Dev {
  OpsBackend* be = nullptr;
  void* p = nullptr;
  size_t bytes = 0;
  Dev(OpsBackend* b, size_t n) : be(b), p(b->alloc(n)), bytes(n) {}
  Dev(OpsBackend* b, const void* src, size_t n) : Dev(b, n) { be->put(p, src, n); }
  ~Dev() { be->free(p); }
  Dev(const Dev&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> read(size_t n) const {
    std::vector<T> v(n);
    be->get(v.data(), p, n * sizeof(T));
    return v;
  }
};

// A summary store in backend memory and its host copy (the same layout).
struct Summaries {
  SummaryLayout layout;
  std::vector<std::unique_ptr<Dev>> arrays;
  SummaryView dev;
  std::unique_ptr<SummaryStore> host;
  std::vector<float> qweight;  // host copy of the query weights (empty: plain summaries)
  std::unique_ptr<Dev> qweight_dev;
  Summaries(OpsBackend* be, const SummaryLayout& l, const std::vector<float>& w = {})
      : layout(l), qweight(w) {
    const size_t nb = size_t(l.num_blocks) * l.num_kv_heads, d = size_t(l.head_dim),
                 r = size_t(l.rank), P = size_t(l.page_size);
    auto add = [&](size_t bytes) {
      arrays.push_back(std::make_unique<Dev>(be, bytes));
      return arrays.back()->p;
    };
    dev.layout = l;
    if (l.precision == Precision::fp32) {
      dev.mu = static_cast<float*>(add(nb * d * 4));
      dev.basis = static_cast<float*>(add(nb * r * d * 4));
      dev.coeff = static_cast<float*>(add(nb * P * r * 4));
    } else {
      dev.mu_q = static_cast<int8_t*>(add(nb * d));
      dev.mu_scale = static_cast<float*>(add(nb * 4));
      dev.basis_q = static_cast<uint8_t*>(add(nb * r * d / 2));
      dev.basis_scale = static_cast<float*>(add(nb * size_t(basis_scales_per_head(l)) * 4));
      dev.coeff_q = static_cast<int8_t*>(add(nb * P * r));
      dev.coeff_scale = static_cast<float*>(add(nb * r * 4));
    }
    host = std::make_unique<SummaryStore>(l);
    if (!qweight.empty()) {
      qweight_dev = std::make_unique<Dev>(be, qweight.data(), qweight.size() * 4);
      dev.qweight = qweight_dev->as<float>();
    }
  }
  void poison(OpsBackend* be) {
    for (auto& a : arrays) be->fill(a->p, 0x5a, a->bytes);
  }
  // The host copy's view (with the host query weights, if any).
  SummaryView host_view() const {
    SummaryView h = host->view();
    h.qweight = qweight.empty() ? nullptr : qweight.data();
    return h;
  }
  // Downloads into host and returns the host view.
  SummaryView download(OpsBackend* be) {
    SummaryView h = host_view();
    void* dst[] = {h.mu, h.basis, h.coeff};
    void* qdst[] = {h.mu_q, h.mu_scale, h.basis_q, h.basis_scale, h.coeff_q, h.coeff_scale};
    for (size_t i = 0; i < (layout.precision == Precision::fp32 ? 3u : 6u); ++i)
      be->get(layout.precision == Precision::fp32 ? dst[i] : qdst[i], arrays[i]->p,
              arrays[i]->bytes);
    return h;
  }
};

// One (block, head) of a backend summary against the float64 reference build:
// the centroid within float rounding (+ half a quantization step), and for fp32 summaries the
// reconstruction residual within the solver's error of the optimal rank-r residual.
void expect_summary_matches(const TestCache& t, const SummaryView& sv, int32_t blk, int h,
                            const ref::PageSummary64& r64) {
  const SummaryLayout& l = sv.layout;
  const int d = l.head_dim, r = l.rank, P = l.page_size;
  const int64_t bh = int64_t(blk) * l.num_kv_heads + h;
  std::vector<float> mu(static_cast<size_t>(d)), basis(size_t(r) * d), coeff(size_t(P) * r);
  double half_step = 0;
  if (l.precision == Precision::fp32) {
    std::copy_n(sv.mu + bh * d, d, mu.begin());
    std::copy_n(sv.basis + bh * r * d, r * d, basis.begin());
    std::copy_n(sv.coeff + bh * P * r, P * r, coeff.begin());
  } else {
    summary_dequantize(sv.mu_q + bh * d, sv.mu_scale[bh], sv.basis_q + bh * r * (d / 2),
                       sv.basis_scale + bh * basis_scales_per_head(l), sv.coeff_q + bh * P * r,
                       sv.coeff_scale + bh * r, d, P, r, l.basis_group, mu.data(), basis.data(),
                       coeff.data());
    half_step = 0.5 * sv.mu_scale[bh] * (1 + 1e-6);
    // Each basis scale is its own group's (summary.h): the group's largest entry has code +-7
    // (a scale shared by the row would leave the smaller groups' codes below 7).
    const int g = l.basis_group, ng = d / g;
    for (int k = 0; k < r; ++k)
      for (int j = 0; j < ng; ++j) {
        const float sj = sv.basis_scale[(bh * r + k) * ng + j];
        int top = 0;
        for (int c = j * g; c < (j + 1) * g; ++c) {
          const uint8_t byte = sv.basis_q[(bh * r + k) * (d / 2) + c / 2];
          const int nib = c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
          top = std::max(top, std::abs(nib >= 8 ? nib - 16 : nib));
        }
        EXPECT_EQ(top, sj > 0 ? 7 : 0)
            << "basis row " << k << " group " << j << " of block " << blk << " head " << h;
      }
  }
  double kmax = 0;
  const CacheLayout& L = t.layout();
  std::vector<double> K(static_cast<size_t>(P) * d);
  for (int s = 0; s < P; ++s)
    for (int c = 0; c < d; ++c) {
      K[size_t(s) * d + c] = load_as_float(t.view().k, L.dtype, L.offset(blk, s, h) + c);
      kmax = std::max(kmax, std::fabs(K[size_t(s) * d + c]));
    }
  for (int c = 0; c < d; ++c)
    ASSERT_NEAR(mu[size_t(c)], r64.mu[size_t(c)], half_step + 4 * P * kEps32 * kmax)
        << "mu of block " << blk << " head " << h << " dim " << c;
  if (l.precision != Precision::fp32) return;
  // ||K - mu - C V||^2 vs the optimum sum_{k >= r} sigma_k^2. Errors: float storage of mu,
  // V, C (~eps32 ||K||^2 each) and the eigen-solver's (CUDA: fp32 Jacobi on the Gram
  // matrix, eigenvalues within ~P eps32 sigma_0^2 each).
  // (In the weighted metric for query-weighted summaries: (K - mu) * w - C V.)
  const float* w = sv.qweight ? sv.qweight + int64_t(h) * d : nullptr;
  double resid = 0, frob = 0;
  for (int s = 0; s < P; ++s)
    for (int c = 0; c < d; ++c) {
      double x = (K[size_t(s) * d + c] - mu[size_t(c)]) * (w ? double(w[c]) : 1.0);
      frob += x * x;
      for (int k = 0; k < r; ++k) x -= double(coeff[size_t(s) * r + k]) * basis[size_t(k) * d + c];
      resid += x * x;
    }
  double opt = 0;
  for (size_t k = size_t(r); k < r64.sigma.size(); ++k) opt += r64.sigma[k] * r64.sigma[k];
  const double s0 = r64.sigma.empty() ? 0 : r64.sigma[0] * r64.sigma[0];
  EXPECT_NEAR(resid, opt, 64.0 * r * P * kEps32 * (s0 + frob) + 1e-12)
      << "residual of block " << blk << " head " << h;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {
 protected:
  void SetUp() override {
    be_ = make_backend();
    const std::string why = be_->unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
    const OpCase& c = GetParam();
    DecodeShape shape{c.head_dim, c.page_size, c.group, c.dtype, c.rank, c.precision};
    const Support s = supports(be_->kind(), shape);
    if (!s.ok) GTEST_SKIP() << s.reason;
    CacheSpec sp;
    sp.dtype = c.dtype;
    sp.page_size = c.page_size;
    sp.num_kv_heads = c.kv_heads;
    sp.num_q_heads = c.kv_heads * c.group;
    sp.head_dim = c.head_dim;
    sp.seq_lens = c.lens;
    sp.structured = c.structured;
    sp.seed = 7 + c.head_dim + c.page_size;
    t_ = make_cache(sp);
    const CacheLayout& L = t_.layout();
    put_cache(c.kv);
    const BatchView& hb = t_.bv();
    bt_ = std::make_unique<Dev>(be_.get(), hb.block_table,
                                size_t(hb.batch_size) * hb.block_table_stride * 4);
    lens_ = std::make_unique<Dev>(be_.get(), hb.seq_lens, size_t(hb.batch_size) * 4);
    q_ = std::make_unique<Dev>(be_.get(), t_.q.data(), t_.q.size() * 4);
    batch_ = hb;
    batch_.block_table = bt_->as<int32_t>();
    batch_.seq_lens = lens_->as<int32_t>();
    qv_ = {q_->as<float>(), sp.num_q_heads};
    sl_ = summary_layout_for(L, c.rank, c.precision, c.basis_group);
    if (c.weighted) {  // weights over two orders of magnitude, like real query RMS profiles
      std::mt19937 rng(uint32_t(11 + c.head_dim));
      std::normal_distribution<float> n(0.0f, 1.2f);
      qweight_.resize(size_t(c.kv_heads) * c.head_dim);
      for (float& x : qweight_) x = std::exp(n(rng));
    }
  }

  // The host cache's K/V in backend memory as `kv` says; sets cache_. The reference reads the
  // dense host copy (t_.view()).
  void put_cache(KvMem kv) {
    const CacheLayout& L = t_.layout();
    const int64_t E = L.block_elems(), N = L.num_blocks;
    const size_t es = size_t(dtype_size(L.dtype)), eb = size_t(E) * es;
    if (kv == KvMem::dense) {
      k_ = std::make_unique<Dev>(be_.get(), t_.view().k, size_t(N) * eb);
      v_ = std::make_unique<Dev>(be_.get(), t_.view().v, size_t(N) * eb);
      cache_ = {k_->p, v_->p, L};
      return;
    }
    const int64_t stride = kv == KvMem::interleaved ? 2 * E : E + kPad;
    const size_t sb = size_t(stride) * es;
    std::vector<uint8_t> h(size_t(N) * sb, 0xff);  // 0xff..: NaN in f32, f16 and bf16
    if (kv == KvMem::interleaved) {
      scatter_blocks(h.data(), t_.view().k, N, eb, sb);
      scatter_blocks(h.data() + eb, t_.view().v, N, eb, sb);
      k_ = std::make_unique<Dev>(be_.get(), h.data(), h.size());
      cache_ = {k_->p, static_cast<char*>(k_->p) + eb, L, stride};
      return;
    }
    scatter_blocks(h.data(), t_.view().k, N, eb, sb);
    k_ = std::make_unique<Dev>(be_.get(), h.data(), h.size());
    std::fill(h.begin(), h.end(), uint8_t(0xff));
    scatter_blocks(h.data(), t_.view().v, N, eb, sb);
    v_ = std::make_unique<Dev>(be_.get(), h.data(), h.size());
    cache_ = {k_->p, v_->p, L, stride};
  }

  // Bulk build of every full page on the backend; the host copy checked against the reference.
  std::unique_ptr<Summaries> build_all() {
    auto s = std::make_unique<Summaries>(be_.get(), sl_, qweight_);
    const std::vector<int32_t> ids = t_.full_blocks();
    Dev dids(be_.get(), ids.data(), std::max<size_t>(ids.size(), 1) * 4);
    be_->summary_build(cache_, dids.as<int32_t>(), int64_t(ids.size()), s->dev);
    be_->finish();
    s->download(be_.get());
    return s;
  }

  DecodeParams params(const SelectConfig& sel) const {
    DecodeParams p;
    p.cache = t_.layout();
    p.summary = sl_;
    p.num_q_heads = t_.spec.num_q_heads;
    p.max_batch = t_.bv().batch_size;
    p.max_blocks_per_seq = t_.max_blocks();
    p.select = sel;
    return p;
  }

  std::unique_ptr<OpsBackend> be_;
  TestCache t_;
  std::unique_ptr<Dev> k_, v_, bt_, lens_, q_;
  KvCacheView cache_;
  BatchView batch_;
  QueryView qv_;
  SummaryLayout sl_;
  std::vector<float> qweight_;  // query weights [H, d] of a weighted case, else empty
};

TEST_P(BackendOps, SummaryBuildMatchesReference) {
  auto s = build_all();
  const SummaryView hv = s->host_view();
  int checked = 0;
  for (const int32_t blk : t_.full_blocks())
    for (int h = 0; h < t_.spec.num_kv_heads; ++h, ++checked)
      expect_summary_matches(t_, hv, blk, h,
                             ref::summary_build_page(t_.view(), blk, h, sl_.rank, hv.qweight));
  EXPECT_EQ(checked, int(t_.full_blocks().size()) * t_.spec.num_kv_heads);
}

// The filled-page builds write exactly the blocks of the reference's rule (every other
// block keeps its poison bytes), each matching the reference build.
void expect_built_exactly(const TestCache& t, Summaries& s, OpsBackend* be,
                          const std::vector<int32_t>& expect, const SummaryLayout& sl) {
  Summaries poison(be, sl, s.qweight);
  poison.poison(be);
  const SummaryView after = s.download(be);
  const SummaryView untouched = poison.download(be);
  const std::set<int32_t> built(expect.begin(), expect.end());
  const int H = sl.num_kv_heads, d = sl.head_dim;
  for (int64_t blk = 0; blk < sl.num_blocks; ++blk)
    for (int h = 0; h < H; ++h) {
      const int64_t bh = blk * H + h;
      if (built.count(int32_t(blk))) {
        expect_summary_matches(
            t, after, int32_t(blk), h,
            ref::summary_build_page(t.view(), int32_t(blk), h, sl.rank, after.qweight));
      } else if (sl.precision == Precision::fp32) {
        EXPECT_EQ(std::memcmp(after.mu + bh * d, untouched.mu + bh * d, size_t(d) * 4), 0)
            << "block " << blk << " was written but did not fill";
      } else {
        EXPECT_EQ(std::memcmp(after.mu_q + bh * d, untouched.mu_q + bh * d, size_t(d)), 0)
            << "block " << blk << " was written but did not fill";
      }
    }
}

TEST_P(BackendOps, SummaryBuildFilledFollowsTheLengthRule) {
  for (const int appended : {1, 3, t_.spec.page_size}) {
    SCOPED_TRACE(testing::Message() << "appended " << appended);
    Summaries s(be_.get(), sl_, qweight_);
    s.poison(be_.get());
    be_->summary_build_filled(cache_, batch_, appended, s.dev);
    be_->finish();
    const std::vector<int32_t> expect = ref::filled_blocks(t_.layout(), t_.bv(), appended);
    expect_built_exactly(t_, s, be_.get(), expect, sl_);
  }
}

TEST_P(BackendOps, SummaryBuildSlotsFollowsTheSlotRule) {
  // The slots a serving engine wrote this step: the last token of every sequence, the
  // token before it, and padding.
  const int P = t_.spec.page_size;
  std::vector<int32_t> slots{-1};
  for (int b = 0; b < t_.bv().batch_size; ++b) {
    const int32_t len = t_.bv().seq_lens[b];
    for (int32_t tok : {len - 1, len - 2})
      if (tok >= 0) slots.push_back(t_.block_of(b, tok / P) * P + tok % P);
    slots.push_back(-1);
  }
  Dev ds(be_.get(), slots.data(), slots.size() * 4);
  Summaries s(be_.get(), sl_, qweight_);
  s.poison(be_.get());
  be_->summary_build_slots(cache_, ds.as<int32_t>(), int64_t(slots.size()), s.dev);
  be_->finish();
  const std::vector<int32_t> expect =
      ref::slot_blocks(t_.layout(), slots.data(), int64_t(slots.size()));
  expect_built_exactly(t_, s, be_.get(), expect, sl_);
}

// A serving engine's cache write fused with the summary update (cache_write_slots): new K/V
// rows for the last token of every sequence, a whole page of sequence 0 written in the same call
// (a prefill chunk: the page's build reads the call's rows, not the cache being written), one
// slot named twice (the later row stays) and padding. Token rows at a padded stride (16-byte
// aligned: vector copies) and at an odd one (element copies), with and without summaries. The
// cache then holds exactly the host-side writes, and the blocks whose last slot was named are
// rebuilt from it (the others keep their poison).
TEST_P(BackendOps, CacheWriteSlotsWritesThenBuilds) {
  const CacheLayout& L = t_.layout();
  const int P = L.page_size, H = L.num_kv_heads, d = L.head_dim;
  const int64_t N = L.num_blocks, E = L.block_elems();
  const size_t es = size_t(dtype_size(L.dtype)), row = size_t(d) * es;
  const int B = t_.bv().batch_size;
  std::vector<int32_t> slots{-1};
  for (int b = 0; b < B; ++b)
    slots.push_back(t_.block_of(b, (t_.bv().seq_lens[b] - 1) / P) * P +
                    (t_.bv().seq_lens[b] - 1) % P);
  for (int j = 0; j < P; ++j) slots.push_back(t_.block_of(0, 0) * P + j);
  slots.push_back(-1);
  slots.push_back(slots[1]);  // sequence 0's last slot again: this later row stays
  const int64_t n = int64_t(slots.size());
  struct Run {
    int64_t pad;
    bool build;
  };
  for (const Run run : {Run{8, true}, Run{1, true}, Run{8, false}}) {
    SCOPED_TRACE(testing::Message() << "row pad " << run.pad << (run.build ? ", build" : ""));
    // Rows in the cache dtype, taken from other cache rows (finite, and unlike the slot's own).
    const int64_t ts = int64_t(H) * d + run.pad;
    std::vector<uint8_t> kr(size_t(n * ts) * es, 0), vr(kr.size(), 0);
    const KvCacheView hv = t_.view();
    for (int64_t i = 0; i < n; ++i)
      for (int h = 0; h < H; ++h) {
        const int64_t src = hv.offset((i * 7 + 3) % N, int((i * 5 + 1) % P), (h + 1) % H);
        std::memcpy(kr.data() + size_t(i * ts + h * d) * es,
                    static_cast<const uint8_t*>(hv.k) + src * es, row);
        std::memcpy(vr.data() + size_t(i * ts + h * d) * es,
                    static_cast<const uint8_t*>(hv.v) + src * es, row);
      }
    put_cache(GetParam().kv);  // the host cache as it is now (earlier runs' writes included)
    Dev dk(be_.get(), kr.data(), kr.size()), dv(be_.get(), vr.data(), vr.size());
    Dev ds(be_.get(), slots.data(), slots.size() * 4);
    const TokenRows rows{dk.p, dv.p, n, ts, d, ts, d};
    const KvCacheWriteView wv{const_cast<void*>(cache_.k), const_cast<void*>(cache_.v), L,
                              cache_.block_stride};
    Summaries s(be_.get(), sl_, qweight_);
    s.poison(be_.get());
    be_->cache_write_slots(wv, rows, ds.as<int32_t>(), run.build ? &s.dev : nullptr);
    be_->finish();
    // The same writes on the host cache, in token order.
    for (int64_t i = 0; i < n; ++i) {
      if (slots[size_t(i)] < 0) continue;
      for (int h = 0; h < H; ++h) {
        const int64_t dst = L.offset(slots[size_t(i)] / P, slots[size_t(i)] % P, h);
        std::memcpy(static_cast<uint8_t*>(t_.cache->k_data()) + dst * es,
                    kr.data() + size_t(i * ts + h * d) * es, row);
        std::memcpy(static_cast<uint8_t*>(t_.cache->v_data()) + dst * es,
                    vr.data() + size_t(i * ts + h * d) * es, row);
      }
    }
    const int64_t step = cache_.block_step();
    const size_t eb = size_t(E) * es;
    for (int which = 0; which < 2; ++which) {
      const void* dev = which == 0 ? cache_.k : cache_.v;
      const uint8_t* want = static_cast<const uint8_t*>(which == 0 ? t_.view().k : t_.view().v);
      std::vector<uint8_t> got(eb);
      for (int64_t b = 0; b < N; ++b) {
        be_->get(got.data(), static_cast<const uint8_t*>(dev) + size_t(b * step) * es, eb);
        ASSERT_EQ(std::memcmp(got.data(), want + size_t(b) * eb, eb), 0)
            << (which == 0 ? "K" : "V") << " block " << b << " differs from the host writes";
      }
    }
    const std::vector<int32_t> expect =
        run.build ? ref::slot_blocks(L, slots.data(), n) : std::vector<int32_t>{};
    if (run.build) ASSERT_FALSE(expect.empty());
    expect_built_exactly(t_, s, be_.get(), expect, sl_);
  }
}

// Bad calls of cache_write_slots: null rows and negative strides are refused on every backend
// before anything is written; a slot outside [-1, num_blocks * P) is refused by the CPU (host
// data, nothing written) and skipped by the CUDA kernel (device data, docs/bad_input.md),
// which still writes the call's valid slots.
TEST_P(BackendOps, CacheWriteSlotsBadCalls) {
  const CacheLayout& L = t_.layout();
  const int P = L.page_size, H = L.num_kv_heads, d = L.head_dim;
  const size_t es = size_t(dtype_size(L.dtype)), eb = size_t(L.block_elems()) * es;
  const int64_t step = cache_.block_step();
  const KvCacheWriteView wv{const_cast<void*>(cache_.k), const_cast<void*>(cache_.v), L,
                            cache_.block_stride};
  auto block_bytes = [&](int64_t b) {
    std::vector<uint8_t> got(eb);
    be_->get(got.data(), static_cast<const uint8_t*>(cache_.k) + size_t(b * step) * es, eb);
    return got;
  };
  const int64_t ts = int64_t(H) * d;
  std::vector<uint8_t> kr(size_t(2 * ts) * es, 0x3c);  // finite in every dtype
  Dev dk(be_.get(), kr.data(), kr.size());
  const int32_t good = int32_t(L.num_blocks - 1) * P,
                bad_slots[][2] = {{int32_t(L.num_blocks * P), good}, {-5, good}};
  const std::vector<uint8_t> last_before = block_bytes(L.num_blocks - 1);
  Dev ds(be_.get(), bad_slots[0], 8);
  EXPECT_THROW(
      be_->cache_write_slots(wv, {nullptr, dk.p, 2, ts, d, ts, d}, ds.as<int32_t>(), nullptr),
      InvalidArgument);
  EXPECT_THROW(
      be_->cache_write_slots(wv, {dk.p, dk.p, 2, -ts, d, ts, d}, ds.as<int32_t>(), nullptr),
      InvalidArgument);
  EXPECT_THROW(
      be_->cache_write_slots(wv, {dk.p, dk.p, -1, ts, d, ts, d}, ds.as<int32_t>(), nullptr),
      InvalidArgument);
  if (be_->kind() == Backend::cuda)  // more tokens than the O(n^2) kernel takes
    EXPECT_THROW(
        be_->cache_write_slots(wv, {dk.p, dk.p, cuda::limits::kCacheWriteMaxTokens + 1, 0, d, 0, d},
                               ds.as<int32_t>(), nullptr),
        Unsupported);
  be_->finish();
  EXPECT_EQ(block_bytes(L.num_blocks - 1), last_before) << "a refused call wrote";
  for (const auto& pair : bad_slots) {
    SCOPED_TRACE(testing::Message() << "slot " << pair[0]);
    Dev dslots(be_.get(), pair, 8);
    const TokenRows rows{dk.p, dk.p, 2, ts, d, ts, d};
    if (be_->kind() == Backend::cpu) {
      EXPECT_THROW(be_->cache_write_slots(wv, rows, dslots.as<int32_t>(), nullptr),
                   InvalidArgument);
      EXPECT_EQ(block_bytes(L.num_blocks - 1), last_before) << "a refused call wrote";
    } else {
      be_->cache_write_slots(wv, rows, dslots.as<int32_t>(), nullptr);
      be_->finish();
      const std::vector<uint8_t> after = block_bytes(L.num_blocks - 1);
      for (int h = 0; h < H; ++h)  // the valid slot (offset 0 of the last block) was written
        EXPECT_EQ(std::memcmp(after.data() + size_t(h) * d * es, kr.data(), size_t(d) * es), 0);
    }
  }
}

TEST_P(BackendOps, StepOpsMatchReferenceForEveryBudget) {
  auto s = build_all();
  const SummaryView hv = s->host_view();
  const int P = t_.spec.page_size, B = t_.bv().batch_size, Hq = t_.spec.num_q_heads;
  const int H = t_.spec.num_kv_heads, M = t_.max_blocks(), d = t_.spec.head_dim;
  const int32_t longest = *std::max_element(t_.spec.seq_lens.begin(), t_.spec.seq_lens.end());
  const ArithModel am = be_->arith(t_.spec.dtype);
  // The adaptive ones (tau > 0) compared exactly too: the data and every backend's sums are
  // deterministic, and a mass within float rounding of tau * total is improbable here
  // (tests/ops/test_adaptive_select.cpp covers that edge with a tolerance).
  const std::vector<SelectConfig> budgets{{P, 0, 0},
                                          {3 * P + 5, 1, 1},
                                          {7 * P, 2, 1},
                                          {longest, 0, 0},
                                          {longest + 3 * P, 1, 2},
                                          {7 * P, 2, 1, 0.9f, 1},
                                          {10 * P, 0, 0, 0.5f, 0},
                                          {longest, 1, 0, 0.99f, 0},
                                          // dense_below (a minimum context above the budget,
                                          // the capacity grows): every shorter sequence
                                          // attends every page, the longest selects (len ==
                                          // dense_below is not below it); then all of them
                                          {P, 0, 0, 0.0f, 1, longest},
                                          {7 * P, 2, 1, 0.9f, 1, longest},
                                          {3 * P + 5, 1, 1, 0.0f, 1, longest + 1}};
  for (const SelectConfig& sc : budgets) {
    SCOPED_TRACE(testing::Message()
                 << "budget " << sc.budget_tokens << " sink " << sc.sink_pages << " recent "
                 << sc.recent_pages << " tau " << sc.tau << " floor " << sc.floor_pages
                 << " dense_below " << sc.dense_below);
    const DecodePlan plan = be_->plan(params(sc));
    ASSERT_EQ(plan.capacity, rules::select_capacity(sc.budget_tokens, P, M, sc.dense_below));
    Dev ws(be_.get(), plan.workspace_bytes);
    const Workspace w{ws.p, plan.workspace_bytes};
    Dev hs(be_.get(), size_t(B) * Hq * M * 4), gs(be_.get(), size_t(B) * H * M * 4);
    be_->score_pages(plan, w, s->dev, batch_, qv_, hs.as<float>());
    be_->aggregate_gqa(plan, w, batch_, hs.as<float>(), gs.as<float>());
    const int cap = plan.capacity;
    Dev pages(be_.get(), size_t(B) * H * cap * 4), counts(be_.get(), size_t(B) * H * 4);
    const Selection dsel{pages.as<int32_t>(), counts.as<int32_t>(), cap};
    be_->select_pages(plan, w, batch_, gs.as<float>(), dsel);
    Dev out(be_.get(), size_t(B) * Hq * d * 4), lse(be_.get(), size_t(B) * Hq * 4);
    be_->attention_sparse(plan, w, cache_, batch_, qv_, dsel, {out.as<float>(), lse.as<float>()});
    be_->finish();

    const std::vector<float> hsh = hs.read<float>(size_t(B) * Hq * M);
    expect_scores_match(t_, hv, hsh.data(), am);
    const std::vector<float> gsh = gs.read<float>(size_t(B) * H * M);
    expect_aggregate_match(hsh, t_.bv(), Hq, H, gsh.data(), am);
    // Selection: exactly the reference rule on the backend's own group scores.
    std::vector<int32_t> ph = pages.read<int32_t>(size_t(B) * H * cap),
                         ch = counts.read<int32_t>(size_t(B) * H);
    SelectionBuf rs(B, H, cap);
    const std::vector<double> gd(gsh.begin(), gsh.end());
    ref::select_pages(gd.data(), t_.bv(), H, P, sc, rs.sel);
    EXPECT_EQ(ch, rs.counts);
    for (int64_t i = 0; i < int64_t(B) * H; ++i)
      for (int k = 0; k < rs.counts[size_t(i)]; ++k)
        EXPECT_EQ(ph[size_t(i * cap + k)], rs.pages[size_t(i * cap + k)]) << "row " << i;
    const std::vector<float> oh = out.read<float>(size_t(B) * Hq * d),
                             lh = lse.read<float>(size_t(B) * Hq);
    expect_attention_match(t_, &rs.sel, oh.data(), lh.data(), am);

    // aggregate_select (CUDA: one launch where the plan chose it): the same group scores
    // and lists as the two ops.
    Dev gs3(be_.get(), size_t(B) * H * M * 4), pages3(be_.get(), size_t(B) * H * cap * 4),
        counts3(be_.get(), size_t(B) * H * 4);
    be_->aggregate_select(plan, w, batch_, hs.as<float>(), gs3.as<float>(),
                          Selection{pages3.as<int32_t>(), counts3.as<int32_t>(), cap});
    be_->finish();
    EXPECT_EQ(gs3.read<float>(size_t(B) * H * M), gsh) << "aggregate_select's group scores";
    EXPECT_EQ(counts3.read<int32_t>(size_t(B) * H), ch);
    EXPECT_EQ(pages3.read<int32_t>(size_t(B) * H * cap), ph) << "aggregate_select's lists";

    // score_select (the three with the scores in the workspace): the same lists. Its workspace
    // filled with a pattern first: on CUDA the head scores past a row's full pages stay as they
    // were, so a selection that read them would differ.
    be_->fill(ws.p, 0x7f, plan.workspace_bytes);
    Dev pages4(be_.get(), size_t(B) * H * cap * 4), counts4(be_.get(), size_t(B) * H * 4);
    be_->score_select(plan, w, s->dev, batch_, qv_,
                      Selection{pages4.as<int32_t>(), counts4.as<int32_t>(), cap});
    be_->finish();
    EXPECT_EQ(counts4.read<int32_t>(size_t(B) * H), ch);
    EXPECT_EQ(pages4.read<int32_t>(size_t(B) * H * cap), ph) << "score_select's lists";

    // The whole step gives the same selection and the same bits as the ops in sequence.
    Dev out2(be_.get(), size_t(B) * Hq * d * 4), lse2(be_.get(), size_t(B) * Hq * 4);
    Dev pages2(be_.get(), size_t(B) * H * cap * 4), counts2(be_.get(), size_t(B) * H * 4);
    const Selection dsel2{pages2.as<int32_t>(), counts2.as<int32_t>(), cap};
    be_->decode(plan, w, cache_, s->dev, batch_, qv_, {out2.as<float>(), lse2.as<float>()}, &dsel2);
    be_->finish();
    EXPECT_EQ(counts2.read<int32_t>(size_t(B) * H), ch);
    EXPECT_EQ(out2.read<float>(size_t(B) * Hq * d), oh) << "decode() vs the ops in sequence";
    EXPECT_EQ(lse2.read<float>(size_t(B) * Hq), lh);
  }
}

TEST_P(BackendOps, DenseAttentionMatchesReference) {
  const DecodePlan plan = be_->plan(params({t_.spec.page_size, 0, 0}));
  Dev ws(be_.get(), plan.workspace_bytes);
  const int B = t_.bv().batch_size, Hq = t_.spec.num_q_heads, d = t_.spec.head_dim;
  Dev out(be_.get(), size_t(B) * Hq * d * 4), lse(be_.get(), size_t(B) * Hq * 4);
  be_->attention_dense(plan, {ws.p, plan.workspace_bytes}, cache_, batch_, qv_,
                       {out.as<float>(), lse.as<float>()});
  be_->finish();
  const std::vector<float> oh = out.read<float>(size_t(B) * Hq * d),
                           lh = lse.read<float>(size_t(B) * Hq);
  expect_attention_match(t_, nullptr, oh.data(), lh.data(), be_->arith(t_.spec.dtype));
}

TEST_P(BackendOps, RunCallsRejectCallsOutsideThePlan) {
  const DecodePlan plan = be_->plan(params({t_.spec.page_size, 0, 0}));
  Dev ws(be_.get(), plan.workspace_bytes + 256);
  const int B = t_.bv().batch_size, Hq = t_.spec.num_q_heads, d = t_.spec.head_dim;
  Dev out(be_.get(), size_t(B) * Hq * d * 4);
  const AttentionOutput ao{out.as<float>(), nullptr};
  if (plan.workspace_bytes > 0) {
    EXPECT_THROW(
        be_->attention_dense(plan, {ws.p, plan.workspace_bytes - 1}, cache_, batch_, qv_, ao),
        InvalidArgument);
    EXPECT_THROW(
        be_->attention_dense(plan, {nullptr, plan.workspace_bytes}, cache_, batch_, qv_, ao),
        InvalidArgument);
  }
  BatchView more = batch_;
  more.max_blocks_per_seq = t_.max_blocks() + 1;
  more.block_table_stride = std::max<int64_t>(more.block_table_stride, more.max_blocks_per_seq);
  EXPECT_THROW(be_->attention_dense(plan, {ws.p, plan.workspace_bytes}, cache_, more, qv_, ao),
               InvalidArgument);
  DecodePlan other = plan;
  other.backend = be_->kind() == Backend::cpu ? Backend::cuda : Backend::cpu;
  EXPECT_THROW(be_->attention_dense(other, {ws.p, plan.workspace_bytes}, cache_, batch_, qv_, ao),
               InvalidArgument);
  auto s = build_all();
  SummaryView wrong = s->dev;
  wrong.layout.rank = sl_.rank == 1 ? 2 : sl_.rank - 1;
  Dev hs(be_.get(), size_t(B) * Hq * t_.max_blocks() * 4);
  EXPECT_THROW(
      be_->score_pages(plan, {ws.p, plan.workspace_bytes}, wrong, batch_, qv_, hs.as<float>()),
      InvalidArgument);
  // Summaries with other basis scale groups than planned (valid on their own).
  wrong = s->dev;
  wrong.layout.basis_group = sl_.basis_group == 2 ? 4 : 2;
  EXPECT_THROW(
      be_->score_pages(plan, {ws.p, plan.workspace_bytes}, wrong, batch_, qv_, hs.as<float>()),
      InvalidArgument);
  // score_select: the summaries and the selection's capacity checked before anything is
  // written (the counts keep their pattern).
  const int H = t_.spec.num_kv_heads, cap = plan.capacity;
  Dev pages(be_.get(), size_t(B) * H * (cap + 1) * 4), counts(be_.get(), size_t(B) * H * 4);
  be_->fill(counts.p, 0x5a, size_t(B) * H * 4);
  const std::vector<int32_t> before = counts.read<int32_t>(size_t(B) * H);
  EXPECT_THROW(be_->score_select(plan, {ws.p, plan.workspace_bytes}, wrong, batch_, qv_,
                                 Selection{pages.as<int32_t>(), counts.as<int32_t>(), cap}),
               InvalidArgument);
  EXPECT_THROW(be_->score_select(plan, {ws.p, plan.workspace_bytes}, s->dev, batch_, qv_,
                                 Selection{pages.as<int32_t>(), counts.as<int32_t>(), cap + 1}),
               InvalidArgument);
  EXPECT_THROW(be_->score_select(plan, {ws.p, plan.workspace_bytes}, s->dev, batch_, qv_,
                                 Selection{pages.as<int32_t>(), nullptr, cap}),
               InvalidArgument);
  be_->finish();
  EXPECT_EQ(counts.read<int32_t>(size_t(B) * H), before) << "a refused score_select wrote";
}

// The query in the model's dtype (the cache's fp16 / bf16; bf16 beside an fp32 cache), in a
// strided buffer like a fused QKV projection's rows (the gaps NaN: a read of them shows), and
// the output in that dtype: an engine's own buffers, no conversion copies. Every op reads the
// query as float, so the scores, selection and attention equal the fp32 path's on the rounded
// query bit for bit, and each output value is that result rounded once (round to nearest
// even); an fp32 query at the same stride equals the contiguous one. Unknown dtype codes and
// a stride below one row are refused.
TEST_P(BackendOps, ModelDtypeQueryAndOutputEqualTheFp32PathRounded) {
  auto s = build_all();
  const int P = t_.spec.page_size, B = t_.bv().batch_size, Hq = t_.spec.num_q_heads;
  const int H = t_.spec.num_kv_heads, M = t_.max_blocks(), d = t_.spec.head_dim;
  const DType md = t_.spec.dtype == DType::f32 ? DType::bf16 : t_.spec.dtype;
  const auto round16 = [md](float x) {
    return md == DType::bf16 ? float_to_bf16(x) : float_to_half(x);
  };
  const auto widen16 = [md](uint16_t h) {
    return md == DType::bf16 ? bf16_to_float(h) : half_to_float(h);
  };
  const int64_t row = int64_t(Hq) * d, stride = row + 2 * int64_t(H) * d;  // q, then k and v
  std::vector<uint16_t> q16(size_t(B * stride), uint16_t(0xffff));         // NaN in fp16 and bf16
  std::vector<float> qr(size_t(B * row)),
      qs32(size_t(B * stride), std::numeric_limits<float>::quiet_NaN());
  for (int b = 0; b < B; ++b)
    for (int64_t i = 0; i < row; ++i) {
      const uint16_t h = round16(t_.q[size_t(b * row + i)]);
      q16[size_t(b * stride + i)] = h;
      qr[size_t(b * row + i)] = qs32[size_t(b * stride + i)] = widen16(h);
    }
  Dev q16d(be_.get(), q16.data(), q16.size() * 2), qrd(be_.get(), qr.data(), qr.size() * 4),
      qsd(be_.get(), qs32.data(), qs32.size() * 4);
  const QueryView q16v{q16d.p, Hq, md, stride}, qrv{qrd.p, Hq}, qsv{qsd.p, Hq, DType::f32, stride};

  const DecodePlan plan = be_->plan(params({7 * P, 2, 1}));
  Dev ws(be_.get(), plan.workspace_bytes);
  const Workspace w{ws.p, plan.workspace_bytes};
  const size_t nhs = size_t(B) * Hq * M, nout = size_t(B) * Hq * d;
  Dev hs(be_.get(), nhs * 4), hs16(be_.get(), nhs * 4), hss(be_.get(), nhs * 4);
  be_->score_pages(plan, w, s->dev, batch_, qrv, hs.as<float>());
  be_->score_pages(plan, w, s->dev, batch_, q16v, hs16.as<float>());
  be_->score_pages(plan, w, s->dev, batch_, qsv, hss.as<float>());
  be_->finish();
  const std::vector<float> hsh = hs.read<float>(nhs);
  EXPECT_EQ(hs16.read<float>(nhs), hsh) << "scores from the " << dtype_name(md) << " query";
  EXPECT_EQ(hss.read<float>(nhs), hsh) << "scores from the strided fp32 query";

  Dev gs(be_.get(), size_t(B) * H * M * 4);
  Dev pages(be_.get(), size_t(B) * H * plan.capacity * 4), counts(be_.get(), size_t(B) * H * 4);
  const Selection sel{pages.as<int32_t>(), counts.as<int32_t>(), plan.capacity};
  be_->aggregate_select(plan, w, batch_, hs.as<float>(), gs.as<float>(), sel);
  Dev o32(be_.get(), nout * 4), l32(be_.get(), size_t(B) * Hq * 4);
  Dev o16(be_.get(), nout * 2), l16(be_.get(), size_t(B) * Hq * 4);
  const auto rounded = [&](const Dev& o) {
    std::vector<uint16_t> r;
    for (float x : o.read<float>(nout)) r.push_back(round16(x));
    return r;
  };
  for (const bool dense : {false, true}) {
    SCOPED_TRACE(dense ? "dense attention" : "sparse attention");
    const AttentionOutput a32{o32.p, l32.as<float>()}, a16{o16.p, l16.as<float>(), md};
    if (dense) {
      be_->attention_dense(plan, w, cache_, batch_, qrv, a32);
      be_->attention_dense(plan, w, cache_, batch_, q16v, a16);
    } else {
      be_->attention_sparse(plan, w, cache_, batch_, qrv, sel, a32);
      be_->attention_sparse(plan, w, cache_, batch_, q16v, sel, a16);
    }
    be_->finish();
    EXPECT_EQ(o16.read<uint16_t>(nout), rounded(o32));
    EXPECT_EQ(l16.read<float>(size_t(B) * Hq), l32.read<float>(size_t(B) * Hq));
  }
  // The whole step.
  Dev p2(be_.get(), size_t(B) * H * plan.capacity * 4), c2(be_.get(), size_t(B) * H * 4);
  const Selection sel2{p2.as<int32_t>(), c2.as<int32_t>(), plan.capacity};
  be_->decode(plan, w, cache_, s->dev, batch_, qrv, {o32.p, l32.as<float>()}, &sel2);
  be_->decode(plan, w, cache_, s->dev, batch_, q16v, {o16.p, l16.as<float>(), md}, &sel2);
  be_->finish();
  EXPECT_EQ(o16.read<uint16_t>(nout), rounded(o32)) << "decode()";
  EXPECT_EQ(c2.read<int32_t>(size_t(B) * H), counts.read<int32_t>(size_t(B) * H));

  // Refusals at the boundary.
  const QueryView bad_dtype{q16d.p, Hq, static_cast<DType>(7), stride};
  const QueryView short_stride{q16d.p, Hq, md, row - 1};
  EXPECT_THROW(be_->score_pages(plan, w, s->dev, batch_, bad_dtype, hs.as<float>()),
               InvalidArgument);
  EXPECT_THROW(be_->score_pages(plan, w, s->dev, batch_, short_stride, hs.as<float>()),
               InvalidArgument);
  EXPECT_THROW(be_->attention_sparse(plan, w, cache_, batch_, qrv, sel,
                                     {o16.p, l16.as<float>(), static_cast<DType>(9)}),
               InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Cases, BackendOps, ::testing::ValuesIn(cases()),
                         [](const testing::TestParamInfo<OpCase>& i) { return name_of(i.param); });

// Block strides at the boundary (kv_cache.h: validate_cache): every op that reads the cache
// refuses, with InvalidArgument and before writing anything, a stride below one block, K and
// V sharing memory, and a stride whose offsets overflow; a 16-byte-unaligned stride is read by
// the CPU backend (checked against the reference) and refused by the CUDA one.
TEST(BackendCacheViews, BlockStridesAreCheckedAtTheBoundary) {
  auto be = make_backend();
  if (!be->unavailable().empty()) GTEST_SKIP() << be->unavailable();
  CacheSpec sp;
  sp.dtype = DType::bf16;
  sp.page_size = 16;
  sp.num_kv_heads = 2;
  sp.num_q_heads = 4;
  sp.head_dim = 64;
  sp.seq_lens = {40, 17};
  TestCache t = make_cache(sp);
  const CacheLayout& L = t.layout();
  const int64_t E = L.block_elems(), N = L.num_blocks;
  const size_t eb = size_t(E) * 2;
  // One allocation with room for every view below: N blocks 2E + 8 elements apart, K at 0.
  const int64_t wide = 2 * E + 8;
  std::vector<uint8_t> h(size_t(N * wide + E) * 2, 0);
  Dev mem(be.get(), h.data(), h.size());
  char* base = static_cast<char*>(mem.p);
  const SummaryLayout sl = summary_layout_for(L, 8, Precision::quant);
  Summaries s(be.get(), sl);
  DecodeParams p;
  p.cache = L;
  p.summary = sl;
  p.num_q_heads = sp.num_q_heads;
  p.max_batch = t.bv().batch_size;
  p.max_blocks_per_seq = t.max_blocks();
  p.select = {sp.page_size, 0, 0};
  const DecodePlan plan = be->plan(p);
  Dev ws(be.get(), plan.workspace_bytes), out(be.get(), size_t(2) * 4 * 64 * 4),
      lse(be.get(), size_t(2) * 4 * 4);
  const BatchView& hb = t.bv();
  Dev bt(be.get(), hb.block_table, size_t(hb.batch_size) * hb.block_table_stride * 4);
  Dev lens(be.get(), hb.seq_lens, size_t(hb.batch_size) * 4);
  Dev q(be.get(), t.q.data(), t.q.size() * 4);
  BatchView bv = hb;
  bv.block_table = bt.as<int32_t>();
  bv.seq_lens = lens.as<int32_t>();
  const std::vector<int32_t> ids = t.full_blocks();
  Dev dids(be.get(), ids.data(), ids.size() * 4);
  const int32_t slots[] = {15, -1};
  Dev dslots(be.get(), slots, sizeof(slots));
  const QueryView qv{q.as<float>(), sp.num_q_heads};
  const AttentionOutput ao{out.as<float>(), lse.as<float>()};
  auto refused = [&](const KvCacheView& c, const std::string& what) {
    SCOPED_TRACE(what);
    s.poison(be.get());
    const std::vector<uint8_t> before = s.arrays[0]->read<uint8_t>(s.arrays[0]->bytes);
    EXPECT_THROW(be->attention_dense(plan, {ws.p, plan.workspace_bytes}, c, bv, qv, ao),
                 InvalidArgument);
    EXPECT_THROW(be->decode(plan, {ws.p, plan.workspace_bytes}, c, s.dev, bv, qv, ao, nullptr),
                 InvalidArgument);
    EXPECT_THROW(be->summary_build(c, dids.as<int32_t>(), int64_t(ids.size()), s.dev),
                 InvalidArgument);
    EXPECT_THROW(be->summary_build_filled(c, bv, 1, s.dev), InvalidArgument);
    EXPECT_THROW(be->summary_build_slots(c, dslots.as<int32_t>(), 2, s.dev), InvalidArgument);
    be->finish();
    EXPECT_EQ(s.arrays[0]->read<uint8_t>(s.arrays[0]->bytes), before) << "summaries written";
  };
  refused({base, base + N * eb, L, E - 8}, "block stride below one block");
  refused({base, base, L, 2 * E}, "V = K");
  refused({base, base + eb, L}, "dense stride, V one block after K (K block 1 = V block 0)");
  refused({base, base + eb / 2, L, 2 * E}, "interleaved, V half a block after K");
  refused({base, base + eb, L, std::numeric_limits<int64_t>::max() / 2}, "stride overflows");

  // Unaligned: blocks E + 4 elements (8 bytes) apart, K and V interleaved.
  const int64_t odd = 2 * E + 4;
  scatter_blocks(h.data(), t.view().k, N, eb, size_t(odd) * 2);
  scatter_blocks(h.data() + eb, t.view().v, N, eb, size_t(odd) * 2);
  be->put(mem.p, h.data(), h.size());
  const KvCacheView unaligned{base, base + eb, L, odd};
  if (be->kind() == Backend::cuda) {
    refused(unaligned, "block stride not a multiple of 16 bytes (CUDA)");
  } else {
    be->attention_dense(plan, {ws.p, plan.workspace_bytes}, unaligned, bv, qv, ao);
    be->finish();
    const std::vector<float> oh = out.read<float>(size_t(2) * 4 * 64),
                             lh = lse.read<float>(size_t(2) * 4);
    expect_attention_match(t, nullptr, oh.data(), lh.data(), be->arith(sp.dtype));
  }
}

// 1,000 plan / run cycles over varying batch shapes and budgets with one caller-owned
// workspace (sized once for the largest plan): the process's memory stays flat, i.e. no
// run call and no plan keeps memory. (The previous Python binding kept a decoder with its
// own buffers per batch shape; this is the test that would have caught it.)
TEST(BackendMemory, ThousandPlanRunCyclesKeepMemoryFlat) {
  auto be = make_backend();
  if (!be->unavailable().empty()) GTEST_SKIP() << be->unavailable();
  CacheSpec sp;
  sp.dtype = DType::bf16;
  sp.page_size = 16;
  sp.num_kv_heads = 2;
  sp.num_q_heads = 8;
  sp.head_dim = 64;
  sp.seq_lens = {300, 47, 160, 16};
  TestCache t = make_cache(sp);
  const CacheLayout& L = t.layout();
  const SummaryLayout sl = summary_layout_for(L, 8, Precision::quant);
  ASSERT_TRUE(supports(be->kind(), {64, 16, 4, DType::bf16, 8, Precision::quant}).ok);
  const size_t kv_bytes = size_t(L.num_blocks) * L.block_elems() * 2;
  Dev k(be.get(), t.view().k, kv_bytes), v(be.get(), t.view().v, kv_bytes);
  const BatchView& hb = t.bv();
  Dev bt(be.get(), hb.block_table, size_t(hb.batch_size) * hb.block_table_stride * 4);
  Dev lens(be.get(), hb.seq_lens, size_t(hb.batch_size) * 4);
  Dev q(be.get(), t.q.data(), t.q.size() * 4);
  Summaries s(be.get(), sl);
  const std::vector<int32_t> ids = t.full_blocks();
  Dev dids(be.get(), ids.data(), ids.size() * 4);
  const KvCacheView cache{k.p, v.p, L};
  be->summary_build(cache, dids.as<int32_t>(), int64_t(ids.size()), s.dev);
  const int M = t.max_blocks(), B = hb.batch_size, Hq = sp.num_q_heads;
  Dev out(be.get(), size_t(B) * Hq * sp.head_dim * 4), lse(be.get(), size_t(B) * Hq * 4);

  auto params_of = [&](int cycle) {
    DecodeParams p;
    p.cache = L;
    p.summary = sl;
    p.num_q_heads = Hq;
    p.max_batch = 1 + cycle % B;
    p.max_blocks_per_seq = M - (cycle / 7) % 3;
    const int budgets[] = {16, 48, 100, 4096};
    const int budget = budgets[(cycle / 2) % 4];
    p.select = {budget, budget >= 32 ? (cycle / 5) % 2 : 0, 0};
    return p;
  };
  size_t most = 0;
  for (int c = 0; c < 1000; ++c) most = std::max(most, be->plan(params_of(c)).workspace_bytes);
  Dev ws(be.get(), most);
  // Two passes of 1,000 cycles; memory is compared across the second pass, so that what
  // the first use of each kernel variant loads (CUDA lazy module loading) is not counted.
  int64_t before = 0, run_allocations = 0;
  for (int c = 0; c < 2000; ++c) {
    const DecodeParams p = params_of(c % 1000);
    const DecodePlan plan = be->plan(p);
    ASSERT_LE(plan.workspace_bytes, most);
    BatchView bv = hb;
    bv.block_table = bt.as<int32_t>();
    bv.seq_lens = lens.as<int32_t>();
    bv.batch_size = p.max_batch;
    bv.max_blocks_per_seq = p.max_blocks_per_seq;
    // Keep the lengths within the planned pages: the first sequence is the longest.
    if (bv.max_blocks_per_seq < M) {
      bv.seq_lens += 1;
      bv.block_table += hb.block_table_stride;
      bv.batch_size = std::min(bv.batch_size, B - 1);
    }
    const int64_t a0 = be->host_allocations();
    be->decode(plan, {ws.p, plan.workspace_bytes}, cache, s.dev, bv, {q.as<float>(), Hq},
               {out.as<float>(), lse.as<float>()}, nullptr);
    run_allocations += be->host_allocations() - a0;
    if (c == 999) {
      be->finish();
      before = be->memory_in_use();
    }
  }
  be->finish();
  const int64_t after = be->memory_in_use();
  // CUDA: device memory in use is exact; CPU: the resident set may move by allocator noise.
  const int64_t slack = be->kind() == Backend::cuda ? 0 : (int64_t(1) << 20);
#ifdef LOCKS_SANITIZED
  // Under AddressSanitizer the resident set measures its shadow memory and quarantine, not
  // the program's: only the allocation count below is checked there (and LeakSanitizer
  // checks leaks). LOCKS_SANITIZED, not gcc's __SANITIZE_ADDRESS__, which clang lacks.
  if (be->kind() == Backend::cpu) before = after;
#endif
  EXPECT_LE(after - before, slack) << "memory grew from " << before << " to " << after;
  // Where the binary counts host allocations (CPU): the run calls made none at all.
  if (be->host_allocations() >= 0) EXPECT_EQ(run_allocations, 0);
}

}  // namespace
}  // namespace locks::test
