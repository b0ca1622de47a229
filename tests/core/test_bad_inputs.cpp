// Every bad input is rejected with locks::Error at the API boundary, never a crash or a
// silent clamp. Each test starts from a valid setup (checked to run without throwing, so a
// throw is caused by the one thing the test breaks) and breaks one thing, for every entry
// point that receives it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "locks/attention.h"
#include "locks/decoder.h"
#include "locks/error.h"
#include "locks/metrics.h"
#include "test_util.h"

namespace locks::test {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Two sequences (lengths 13 and 16, P = 8, two KV heads, four query heads, d = 32).
struct Valid {
  TestCache t;
  SummaryStore store;
  std::vector<float> hs, gs, out, lse;
  SelectConfig cfg{16, 0, 0};
  SelectionBuf sel;
  int B, Hq, H, M;

  Valid()
      : t(make([] {
          CacheSpec sp;
          sp.page_size = 8;
          sp.head_dim = 32;
          sp.num_kv_heads = 2;
          sp.num_q_heads = 4;
          sp.seq_lens = {13, 16};
          return sp;
        }())),
        store(build_summaries(t, 3, Precision::fp32)),
        sel(2, 2, 2) {
    B = 2, Hq = 4, H = 2, M = t.max_blocks();
    hs.resize(size_t(B) * Hq * M);
    gs.resize(size_t(B) * H * M);
    out.resize(size_t(B) * Hq * 32);
    lse.resize(size_t(B) * Hq);
  }
  static TestCache make(const CacheSpec& sp) { return make_cache(sp); }

  SummaryView sv() { return store.view(); }
  AttentionOutput ao() { return {out.data(), lse.data()}; }

  // Every per-step entry point with the given batch and query.
  void score(const BatchView& bv, const QueryView& q) {
    cpu::score_pages(sv(), bv, q, t.scale(), hs.data());
  }
  void aggregate(const BatchView& bv) { cpu::aggregate_gqa(hs.data(), bv, Hq, H, gs.data()); }
  void select(const BatchView& bv) { cpu::select_pages(gs.data(), bv, H, 8, cfg, sel.sel); }
  void dense(const BatchView& bv, const QueryView& q) {
    cpu::decode_attention_dense(t.view(), bv, q, t.scale(), ao());
  }
  void sparse(const BatchView& bv, const QueryView& q) {
    cpu::decode_attention_sparse(t.view(), bv, q, t.scale(), sel.sel, ao());
  }
  void decoder(const BatchView& bv, const QueryView& q) {
    cpu::Decoder dec(t.layout(), Hq, B, M, {cfg, 0.0f});
    dec.run(t.view(), sv(), bv, q, ao());
  }
  void recall(const BatchView& bv, const QueryView& q) {
    std::vector<double> r(size_t(B) * Hq);
    attention_mass_recall(t.view(), bv, q, t.scale(), sel.sel, r.data());
  }
  // The valid pipeline, run once so that sel holds a valid selection.
  void run_all() {
    score(t.bv(), t.qv());
    aggregate(t.bv());
    select(t.bv());
    dense(t.bv(), t.qv());
    sparse(t.bv(), t.qv());
    decoder(t.bv(), t.qv());
    recall(t.bv(), t.qv());
  }
};

// True when f throws locks::Error (any other exception, or none, is a failure).
template <class F>
bool throws_error(F&& f) {
  try {
    f();
  } catch (const Error&) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

void expect_all_steps_throw(Valid& s, const BatchView& bv, const QueryView& q) {
  EXPECT_TRUE(throws_error([&] { s.score(bv, q); })) << "score_pages";
  EXPECT_TRUE(throws_error([&] { s.dense(bv, q); })) << "decode_attention_dense";
  EXPECT_TRUE(throws_error([&] { s.sparse(bv, q); })) << "decode_attention_sparse";
  EXPECT_TRUE(throws_error([&] { s.decoder(bv, q); })) << "Decoder::run";
  EXPECT_TRUE(throws_error([&] { s.recall(bv, q); })) << "attention_mass_recall";
}
// The trace gives the line of the call.
#define EXPECT_ALL_STEPS_THROW(s, bv, q)    \
  do {                                      \
    SCOPED_TRACE("per-step entry points");  \
    expect_all_steps_throw((s), (bv), (q)); \
  } while (0)

TEST(BadInputs, ValidSetupRuns) {
  Valid s;
  EXPECT_NO_THROW(s.run_all());
}

TEST(BadInputs, QueryHeadsNotAMultipleOfKvHeads) {
  Valid s;
  s.run_all();
  const QueryView q3{s.t.q.data(), 3};
  EXPECT_ALL_STEPS_THROW(s, s.t.bv(), q3);
  EXPECT_THROW(cpu::aggregate_gqa(s.hs.data(), s.t.bv(), 3, 2, s.gs.data()), Error);
  EXPECT_THROW(cpu::Decoder(s.t.layout(), 3, 2, s.M, {}), Error);
  const QueryView q0{s.t.q.data(), 0};
  EXPECT_ALL_STEPS_THROW(s, s.t.bv(), q0);
}

TEST(BadInputs, BlockTableTooShort) {
  Valid s;
  s.run_all();
  // Sequence 1 (16 tokens, 2 pages) claims 17 tokens: it needs a third block the table lacks.
  std::vector<int32_t> lens{13, 17};
  BatchView bv = s.t.bv();
  bv.seq_lens = lens.data();
  EXPECT_ALL_STEPS_THROW(s, bv, s.t.qv());
  EXPECT_THROW(s.select(bv), Error);
  // A row stride shorter than the rows it claims.
  BatchView narrow = s.t.bv();
  narrow.block_table_stride = narrow.max_blocks_per_seq - 1;
  EXPECT_ALL_STEPS_THROW(s, narrow, s.t.qv());
}

TEST(BadInputs, InvalidHeadDimOrPageSize) {
  // head_dim: even, in [8, 512] (kv_cache.h's head_dim_valid).
  for (int d : {-2, 0, 6, 47, 101, 514, 1024}) {
    CacheLayout l{4, 16, 1, d, DType::f32};
    EXPECT_THROW(validate_layout(l), Error) << "head_dim " << d;
    EXPECT_THROW(PagedKvCache{l}, Error) << "head_dim " << d;
    EXPECT_THROW(cpu::Decoder(l, 1, 1, 4, {}), Error);
  }
  for (int p : {0, 1, 257}) {
    CacheLayout l{4, p, 1, 64, DType::f32};
    EXPECT_THROW(validate_layout(l), Error) << "page_size " << p;
    EXPECT_THROW(PagedKvCache{l}, Error) << "page_size " << p;
  }
  EXPECT_THROW(validate_layout({0, 16, 1, 64, DType::f32}), Error);  // no blocks
  EXPECT_THROW(validate_layout({4, 16, 0, 64, DType::f32}), Error);  // no heads
  EXPECT_THROW(validate_layout({4, 16, 1, 64, static_cast<DType>(7)}), Error);

  // A view whose layout is invalid, handed to the per-step kernels.
  Valid s;
  s.run_all();
  KvCacheView bad = s.t.view();
  bad.layout.head_dim = 100;
  EXPECT_THROW(cpu::decode_attention_dense(bad, s.t.bv(), s.t.qv(), s.t.scale(), s.ao()), Error);
  EXPECT_THROW(
      cpu::decode_attention_sparse(bad, s.t.bv(), s.t.qv(), s.t.scale(), s.sel.sel, s.ao()), Error);
  bad = s.t.view();
  bad.layout.page_size = 1;
  EXPECT_THROW(cpu::decode_attention_dense(bad, s.t.bv(), s.t.qv(), s.t.scale(), s.ao()), Error);
  EXPECT_THROW(cpu::select_pages(s.gs.data(), s.t.bv(), 2, 1, s.cfg, s.sel.sel), Error);
  SummaryView sv = s.sv();
  sv.layout.head_dim = 33;  // odd: int4 pairs impossible
  EXPECT_THROW(cpu::score_pages(sv, s.t.bv(), s.t.qv(), s.t.scale(), s.hs.data()), Error);
}

TEST(BadInputs, RankNotBelowPageSize) {
  const CacheLayout l{4, 8, 1, 32, DType::f32};
  for (int r : {0, 8, 9, -1}) {
    SummaryLayout sl{4, 8, 1, 32, r, Precision::fp32, 32};
    EXPECT_THROW(validate_summary_layout(sl), Error) << "rank " << r;
    EXPECT_THROW(summary_layout_for(l, r, Precision::quant), Error) << "rank " << r;
    EXPECT_THROW(SummaryStore{sl}, Error) << "rank " << r;
  }
  // rank > head_dim (P = 64 > d = 32).
  EXPECT_THROW(validate_summary_layout({4, 64, 1, 32, 40, Precision::fp32, 32}), Error);
  // A view claiming rank >= P at build and score time.
  Valid s;
  s.run_all();
  SummaryView sv = s.sv();
  sv.layout.rank = 8;
  const std::vector<int32_t> ids = s.t.full_blocks();
  EXPECT_THROW(cpu::summary_build(s.t.view(), ids.data(), int64_t(ids.size()), sv), Error);
  EXPECT_THROW(cpu::score_pages(sv, s.t.bv(), s.t.qv(), s.t.scale(), s.hs.data()), Error);
  // The quantization helpers, with valid buffers but rank = P.
  std::vector<float> f(8 * 32 * 2, 0.5f), sc(8);
  std::vector<int8_t> i8(8 * 32);
  std::vector<uint8_t> u8(8 * 16);
  float ms = 0;
  EXPECT_THROW(summary_quantize(f.data(), f.data(), f.data(), 32, 8, 8, 32, i8.data(), &ms,
                                u8.data(), sc.data(), i8.data(), sc.data()),
               Error);
  EXPECT_THROW(summary_dequantize(i8.data(), 1.0f, u8.data(), sc.data(), i8.data(), sc.data(), 32,
                                  8, 8, 32, f.data(), f.data(), f.data()),
               Error);
}

// basis_group (dims per int4 basis scale) must be an even divisor of head_dim: refused by the
// layout checks, the store, the build and the scorer, each naming the field.
TEST(BadInputs, BasisGroupNotAnEvenDivisor) {
  const CacheLayout l{4, 8, 1, 32, DType::f32};
  for (int g : {0, 1, 3, 6, 64, -2}) {
    SummaryLayout sl{4, 8, 1, 32, 3, Precision::quant, g};
    EXPECT_THROW(validate_summary_layout(sl), Error) << "basis_group " << g;
    EXPECT_THROW(SummaryStore{sl}, Error) << "basis_group " << g;
    if (g != 0) EXPECT_THROW(summary_layout_for(l, 3, Precision::quant, g), Error) << g;
  }
  Valid s;
  s.run_all();
  SummaryStore q(summary_layout_for(s.t.layout(), 3, Precision::quant));
  SummaryView sv = q.view();
  sv.layout.basis_group = 6;  // does not divide 32
  const std::vector<int32_t> ids = s.t.full_blocks();
  try {
    cpu::summary_build(s.t.view(), ids.data(), int64_t(ids.size()), sv);
    ADD_FAILURE() << "build accepted basis_group 6";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("basis_group"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cpu::score_pages(sv, s.t.bv(), s.t.qv(), s.t.scale(), s.hs.data()), Error);
  EXPECT_THROW(ref::score_page(sv, ids[0], 0, s.t.q.data(), s.t.scale()), Error);
}

TEST(BadInputs, BudgetBelowSinkRecentAndTail) {
  Valid s;
  s.run_all();
  for (const SelectConfig bad :
       {SelectConfig{7, 0, 0},   // b < P: no page even for the tail
        SelectConfig{16, 1, 1},  // 2 pages < 1 + 1 + 1
        SelectConfig{24, 2, 1},  // 3 < 4
        SelectConfig{-8, 0, 0}, SelectConfig{64, -1, 0}, SelectConfig{64, 0, -1}}) {
    SCOPED_TRACE(testing::Message() << "budget " << bad.budget_tokens << " sink " << bad.sink_pages
                                    << " recent " << bad.recent_pages);
    EXPECT_THROW(validate_select(bad, 8), Error);
    EXPECT_THROW(select_capacity(bad, 8, s.M), Error);
    EXPECT_THROW(cpu::select_pages(s.gs.data(), s.t.bv(), 2, 8, bad, s.sel.sel), Error);
    EXPECT_THROW(cpu::Decoder(s.t.layout(), 4, 2, s.M, {bad, 0.0f}), Error);
  }
  // A selection buffer smaller than select_capacity.
  SelectionBuf small(2, 2, 1);
  EXPECT_THROW(cpu::select_pages(s.gs.data(), s.t.bv(), 2, 8, s.cfg, small.sel), Error);
}

TEST(BadInputs, NonFiniteKeysOrValuesOnAppend) {
  for (float bad : {kNaN, kInf, -kInf}) {
    CacheLayout l{4, 8, 2, 32, DType::bf16};
    PagedKvCache cache(l);
    const int seq = cache.add_sequence();
    Rng rng(5);
    std::vector<float> k = rng.normals(3 * 64), v = rng.normals(3 * 64);
    k[100] = bad;
    EXPECT_THROW(cache.append(seq, k.data(), v.data(), 3), Error);
    k[100] = 0.0f;
    v[5] = bad;
    EXPECT_THROW(cache.append(seq, k.data(), v.data(), 3), Error);
    v[5] = 0.0f;
    EXPECT_NO_THROW(cache.append(seq, k.data(), v.data(), 3));
    EXPECT_EQ(cache.seq_len(seq), 3);  // only the valid append landed
  }
  // Values finite in float that overflow to inf when stored as fp16 (max 65504) or bf16
  // (FLT_MAX rounds up to inf): the cache would hold Inf, which the per-step kernels rely on
  // never seeing (kv_cache.h), so append must reject them as it rejects Inf itself.
  for (auto [dt, big] : {std::pair{DType::f16, 1e6f}, std::pair{DType::bf16, 3.4028235e38f}}) {
    SCOPED_TRACE(dtype_name(dt));
    CacheLayout l{4, 8, 1, 32, dt};
    PagedKvCache cache(l);
    cache.add_sequence();
    std::vector<float> k(32, 1.0f), v(32, 0.0f);
    k[3] = big;
    EXPECT_THROW(cache.append(0, k.data(), v.data(), 1), Error);
    k[3] = 1.0f;
    v[3] = big;
    EXPECT_THROW(cache.append(0, k.data(), v.data(), 1), Error);
  }
}

TEST(BadInputs, NonFiniteQuery) {
  for (float bad : {kNaN, kInf, -kInf}) {
    Valid s;
    s.run_all();
    s.t.q[37] = bad;  // sequence 0, head 1
    EXPECT_ALL_STEPS_THROW(s, s.t.bv(), s.t.qv());
    s.t.q[37] = 0.0f;
    s.t.q[s.t.q.size() - 1] = bad;  // last element of the last sequence
    EXPECT_ALL_STEPS_THROW(s, s.t.bv(), s.t.qv());
  }
}

TEST(BadInputs, EmptySequence) {
  Valid s;
  s.run_all();
  for (int32_t bad : {0, -3}) {
    std::vector<int32_t> lens{13, bad};
    BatchView bv = s.t.bv();
    bv.seq_lens = lens.data();
    EXPECT_ALL_STEPS_THROW(s, bv, s.t.qv());
    EXPECT_THROW(s.select(bv), Error);
  }
  // A sequence added to the cache but never appended to.
  s.t.cache->add_sequence();
  const PagedKvCache::Batch b = s.t.cache->batch();
  EXPECT_THROW(validate_batch(s.t.layout(), b.view), Error);
  // A batch with no sequences at all.
  BatchView none = s.t.bv();
  none.batch_size = 0;
  EXPECT_ALL_STEPS_THROW(s, none, s.t.qv());
}

TEST(BadInputs, BlockIdOutOfRange) {
  Valid s;
  s.run_all();
  const int64_t nb = s.t.layout().num_blocks;
  for (int32_t bad : {-1, int32_t(nb), int32_t(nb + 100)}) {
    std::vector<int32_t> table(s.t.batch.block_table);
    table[size_t(s.t.bv().block_table_stride) + 1] = bad;  // sequence 1, page 1 (used)
    BatchView bv = s.t.bv();
    bv.block_table = table.data();
    SCOPED_TRACE(testing::Message() << "block id " << bad);
    EXPECT_ALL_STEPS_THROW(s, bv, s.t.qv());
    EXPECT_THROW(validate_batch(s.t.layout(), bv), Error);
    const int32_t ids[2] = {0, bad};
    EXPECT_THROW(cpu::summary_build(s.t.view(), ids, 2, s.sv()), Error);
  }
  // Unused entries past a sequence's pages are not read: garbage there is fine.
  std::vector<int32_t> lens{5, 16};
  std::vector<int32_t> table(s.t.batch.block_table);
  table[1] = -99;  // sequence 0 now has one page; its second entry is unused
  BatchView bv = s.t.bv();
  bv.block_table = table.data();
  bv.seq_lens = lens.data();
  EXPECT_NO_THROW(validate_batch(s.t.layout(), bv));
  EXPECT_NO_THROW(s.dense(bv, s.t.qv()));
}

TEST(BadInputs, SelectionOutOfRange) {
  Valid s;
  s.run_all();
  auto expect_sparse_throws = [&](const char* what) {
    SCOPED_TRACE(what);
    EXPECT_THROW(s.sparse(s.t.bv(), s.t.qv()), Error);
    EXPECT_THROW(s.recall(s.t.bv(), s.t.qv()), Error);
  };
  const auto saved_p = s.sel.pages;
  const auto saved_c = s.sel.counts;
  s.sel.pages[0] = 2;  // sequence 0 has pages 0..1
  expect_sparse_throws("page beyond the sequence");
  s.sel.pages = saved_p;
  s.sel.pages[0] = -1;
  expect_sparse_throws("negative page");
  s.sel.pages = saved_p;
  s.sel.counts[0] = 0;
  expect_sparse_throws("zero count");
  s.sel.counts = saved_c;
  s.sel.counts[0] = 3;
  expect_sparse_throws("count above capacity");
  s.sel.counts = saved_c;
  s.sel.pages[1] = s.sel.pages[0];
  expect_sparse_throws("pages not ascending");
}

TEST(BadInputs, NullPointers) {
  Valid s;
  s.run_all();
  const QueryView qnull{nullptr, 4};
  EXPECT_ALL_STEPS_THROW(s, s.t.bv(), qnull);
  BatchView bv = s.t.bv();
  bv.block_table = nullptr;
  EXPECT_ALL_STEPS_THROW(s, bv, s.t.qv());
  bv = s.t.bv();
  bv.seq_lens = nullptr;
  EXPECT_ALL_STEPS_THROW(s, bv, s.t.qv());
  EXPECT_THROW(s.select(bv), Error);

  KvCacheView kv = s.t.view();
  kv.k = nullptr;
  EXPECT_THROW(cpu::decode_attention_dense(kv, s.t.bv(), s.t.qv(), s.t.scale(), s.ao()), Error);
  EXPECT_THROW(cpu::summary_build(kv, s.t.full_blocks().data(), 1, s.sv()), Error);
  kv = s.t.view();
  kv.v = nullptr;
  EXPECT_THROW(cpu::decode_attention_dense(kv, s.t.bv(), s.t.qv(), s.t.scale(), s.ao()), Error);
  EXPECT_THROW(cpu::decode_attention_sparse(kv, s.t.bv(), s.t.qv(), s.t.scale(), s.sel.sel, s.ao()),
               Error);

  EXPECT_THROW(cpu::decode_attention_dense(s.t.view(), s.t.bv(), s.t.qv(), s.t.scale(), {}), Error);
  EXPECT_THROW(cpu::score_pages(s.sv(), s.t.bv(), s.t.qv(), s.t.scale(), nullptr), Error);
  EXPECT_THROW(cpu::aggregate_gqa(nullptr, s.t.bv(), 4, 2, s.gs.data()), Error);
  EXPECT_THROW(cpu::aggregate_gqa(s.hs.data(), s.t.bv(), 4, 2, nullptr), Error);
  EXPECT_THROW(cpu::select_pages(nullptr, s.t.bv(), 2, 8, s.cfg, s.sel.sel), Error);
  EXPECT_THROW(cpu::select_pages(s.gs.data(), s.t.bv(), 2, 8, s.cfg, {}), Error);
  EXPECT_THROW(
      cpu::decode_attention_sparse(s.t.view(), s.t.bv(), s.t.qv(), s.t.scale(), {}, s.ao()), Error);
  SummaryView sv = s.sv();
  sv.basis = nullptr;
  EXPECT_THROW(cpu::score_pages(sv, s.t.bv(), s.t.qv(), s.t.scale(), s.hs.data()), Error);
  EXPECT_THROW(cpu::summary_build(s.t.view(), s.t.full_blocks().data(), 1, sv), Error);
  EXPECT_THROW(cpu::summary_build(s.t.view(), nullptr, 1, s.sv()), Error);
  SummaryStore q8(summary_layout_for(s.t.layout(), 3, Precision::quant));
  sv = q8.view();
  sv.coeff_scale = nullptr;
  EXPECT_THROW(cpu::score_pages(sv, s.t.bv(), s.t.qv(), s.t.scale(), s.hs.data()), Error);

  std::vector<float> kv_rows(64);
  EXPECT_THROW(s.t.cache->append(0, nullptr, kv_rows.data(), 1), Error);
  EXPECT_THROW(s.t.cache->append(0, kv_rows.data(), nullptr, 1), Error);
  EXPECT_THROW(s.t.cache->append(7, kv_rows.data(), kv_rows.data(), 1), Error);  // no sequence 7
  EXPECT_THROW(s.t.cache->append(0, kv_rows.data(), kv_rows.data(), -1), Error);

  std::vector<double> r(8);
  EXPECT_THROW(
      attention_mass_recall(s.t.view(), s.t.bv(), s.t.qv(), s.t.scale(), s.sel.sel, nullptr),
      Error);
  EXPECT_THROW(cosine_similarity(nullptr, s.out.data(), 4), Error);
  EXPECT_THROW(relative_l2(s.out.data(), nullptr, 4), Error);
  cpu::Decoder dec(s.t.layout(), 4, 2, s.M, {s.cfg, 0.0f});
  EXPECT_THROW(dec.run(s.t.view(), s.sv(), s.t.bv(), s.t.qv(), {}), Error);
}

TEST(BadInputs, BadScaleAndDecoderShapes) {
  Valid s;
  s.run_all();
  for (float bad : {0.0f, -1.0f, kNaN, kInf}) {
    EXPECT_THROW(cpu::score_pages(s.sv(), s.t.bv(), s.t.qv(), bad, s.hs.data()), Error);
    EXPECT_THROW(cpu::decode_attention_dense(s.t.view(), s.t.bv(), s.t.qv(), bad, s.ao()), Error);
  }
  EXPECT_THROW(cpu::Decoder(s.t.layout(), 4, 2, s.M, {s.cfg, -1.0f}), Error);
  // A batch larger than planned, or longer block rows than planned.
  cpu::Decoder one(s.t.layout(), 4, 1, s.M, {s.cfg, 0.0f});
  EXPECT_THROW(one.run(s.t.view(), s.sv(), s.t.bv(), s.t.qv(), s.ao()), Error);
  cpu::Decoder shorter(s.t.layout(), 4, 2, s.M - 1, {SelectConfig{8, 0, 0}, 0.0f});
  EXPECT_THROW(shorter.run(s.t.view(), s.sv(), s.t.bv(), s.t.qv(), s.ao()), Error);
  // Summaries of another cache shape.
  SummaryStore other(SummaryLayout{s.t.layout().num_blocks + 1, 8, 2, 32, 3, Precision::fp32, 32});
  cpu::Decoder dec(s.t.layout(), 4, 2, s.M, {s.cfg, 0.0f});
  EXPECT_THROW(dec.run(s.t.view(), other.view(), s.t.bv(), s.t.qv(), s.ao()), Error);
  const std::vector<int32_t> ids = s.t.full_blocks();
  EXPECT_THROW(cpu::summary_build(s.t.view(), ids.data(), int64_t(ids.size()), other.view()),
               Error);
}

}  // namespace
}  // namespace locks::test
