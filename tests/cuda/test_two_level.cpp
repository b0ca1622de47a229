// The two-level step on the GPU (super_summary.h, decode_two_level in contract.h), stage by
// stage on the GPU's own intermediate values: level 1 vs cpu::super_score (within a bound
// from the fp32 arithmetic), the page list vs cpu::select_groups_list on the GPU's level-1
// scores (identical), level-2 scores vs the float64 page scores of the listed pages, the
// selection vs cpu::aggregate_gqa + select_pages over list positions on the GPU's level-2
// scores (identical), attention vs the float64 reference on that selection; then CUDA-graph
// capture and replay with a new query.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "cuda_arith.h"
#include "gpu_helpers.h"
#include "gpu_supers.h"
#include "locks/contract.h"
#include "locks/error.h"
#include "locks/reference.h"
#include "locks/super_summary.h"
#include "test_compare.h"

namespace locks::cuda_test {
namespace {

struct Case {
  int Hkv, G;
  TwoLevelConfig two;
  SelectConfig sel;
  bool gpu_supers = false;  // super summaries from cuda::super_build instead of the CPU's
};

struct Fixture {
  static constexpr int P = 16, S = 8, d = 128, R = 8;
  Case c;
  int Hq, B, M, MG;
  CacheLayout L;
  GpuCache gc;
  SummaryLayout sl;
  SummaryStore store;
  GpuSummaries gs;
  std::unique_ptr<GpuSupers> sup;
  std::vector<int32_t> table;
  DevBuf<int32_t> dtable;
  SuperTableView htv, dtv;

  static CacheLayout layout(const Case& c, const std::vector<int64_t>& lens) {
    int64_t blocks = 0;
    for (int64_t l : lens) blocks += (l + P - 1) / P;
    return {blocks + 4, P, c.Hkv, d, DType::bf16};
  }
  Fixture(const Case& cc, const std::vector<int64_t>& lens)
      : c(cc),
        Hq(cc.Hkv * cc.G),
        B(int(lens.size())),
        L(layout(cc, lens)),
        gc(L),
        sl(summary_layout_for(L, 8, Precision::quant)),
        store(sl),
        gs(sl) {
    gc.add_structured(lens, 77);
    M = gc.batch.view.max_blocks_per_seq;
    MG = (M + S - 1) / S;
    const std::vector<int32_t> ids = gc.full_blocks();
    cpu::summary_build(gc.host.view(), ids.data(), int64_t(ids.size()), store.view());
    gs.upload_from(store);
    // Super summaries of every complete group, slots in order.
    table.assign(size_t(B) * MG, -1);
    std::vector<int32_t> blocks, slots;
    const BatchView& hb = gc.batch.view;
    for (int b = 0; b < B; ++b)
      for (int j = 0; j < hb.seq_lens[b] / P / S; ++j) {
        table[size_t(b) * MG + j] = int32_t(slots.size());
        slots.push_back(int32_t(slots.size()));
        for (int p = 0; p < S; ++p)
          blocks.push_back(hb.block_table[int64_t(b) * hb.block_table_stride + j * S + p]);
      }
    SuperLayout ul;
    ul.num_slots = std::max<int64_t>(1, int64_t(slots.size()));
    ul.group_pages = S;
    ul.page_size = P;
    ul.num_kv_heads = c.Hkv;
    ul.head_dim = d;
    ul.rank = R;
    ul.extent = true;
    sup = std::make_unique<GpuSupers>(ul);
    if (!c.gpu_supers) {
      cpu::super_build(gc.host.view(), blocks.data(), slots.data(), int64_t(slots.size()),
                       sup->host.view());
      sup->upload();
    } else {  // built on the device, then copied to the host store the CPU stages read
      sup->upload();
      const DevBuf<int32_t> db(blocks), ds(slots);
      cuda::super_build(gc.dview(), db.p, ds.p, int64_t(slots.size()), sup->dview(), nullptr);
      CK(cudaDeviceSynchronize());
      sup->download();
    }
    dtable = DevBuf<int32_t>(table);
    htv = {table.data(), MG, MG};
    dtv = {dtable.p, MG, MG};
  }
  DecodeParams params() const {
    DecodeParams p;
    p.cache = L;
    p.summary = sl;
    p.num_q_heads = Hq;
    p.max_batch = B;
    p.max_blocks_per_seq = M;
    p.select = c.sel;
    p.two_level = true;
    p.two = c.two;
    p.super = sup->host.layout();
    return p;
  }
};

template <typename T>
std::vector<T> region(const Workspace& ws, const WorkspaceRegion& r, size_t n) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), static_cast<char*>(ws.data) + r.offset, n * sizeof(T),
                cudaMemcpyDeviceToHost));
  return h;
}

// Bound on |gpu - cpu| of a group score: both evaluate the same sums in another order (dots
// of length d and R, R-term extent sums, an S-term log-sum-exp), so each page estimate
// differs by at most ~(d + 2R) u times the sum of the magnitudes of its terms, scaled; the
// LSE adds a few u. The GPU's other roundings stay inside it: the query and the page weights
// as fp16 hi + lo parts (2^-22 relative plus 2^-24 of the head's largest weight: ~5u of a
// term's magnitude on these codes), SFU exp2 / log2 in the LSE (2 ulp: ~8u). 4x margin.
double group_tol(const SuperView& s, int32_t slot, int head, const float* q, float scale,
                 int page_size) {
  const SuperGroupF g = super_dequantize(s, slot, head);
  const int d = s.layout.head_dim, R = s.layout.rank, S = s.layout.group_pages;
  double qm = 0, worst = 0;
  std::vector<double> w(R), wa(R);
  for (int c = 0; c < d; ++c) qm += std::fabs(double(q[c]) * g.mu[c]);
  for (int k = 0; k < R; ++k)
    for (int c = 0; c < d; ++c) {
      w[k] += double(q[c]) * g.basis[size_t(k) * d + c];
      wa[k] += std::fabs(double(q[c]) * g.basis[size_t(k) * d + c]);
    }
  for (int p = 0; p < S; ++p) {
    double mag = qm;
    for (int k = 0; k < R; ++k) {
      const size_t i = size_t(p) * R + k;
      double e = std::fabs(g.coord[i]);
      if (!g.hi.empty())  // layouts without extent hold coordinates only
        e = std::max({e, std::fabs(double(g.hi[i])), std::fabs(double(g.lo[i]))});
      mag += (std::fabs(w[k]) + wa[k]) * e;
    }
    worst = std::max(worst, mag);
  }
  const double u = std::ldexp(1.0, -24);
  return 4.0 *
         ((d + 2 * R + 8) * u * scale * worst + 16 * u * (std::log(double(page_size * S)) + 1));
}

void run_case(const Case& c, const std::vector<int64_t>& lens) {
  Fixture f(c, lens);
  const int B = f.B, Hq = f.Hq, Hkv = c.Hkv, d = Fixture::d, P = Fixture::P, S = Fixture::S;
  const DecodePlan plan = cuda::plan_decode(f.params());
  const int Lc = plan.list_cap, cap = plan.capacity;
  DevBuf<uint8_t> wsb(plan.workspace_bytes);
  const Workspace ws{wsb.p, plan.workspace_bytes};
  const std::vector<float> q = random_queries(B, Hq, d, 1.5f, 5);
  DevBuf<float> dq(q);
  const QueryView hq{q.data(), Hq}, dqv{dq.p, Hq};
  const BatchView hb = f.gc.batch.view, db = f.gc.dbatch();
  DevBuf<float> out(size_t(B) * Hq * d), lse(size_t(B) * Hq);
  DevBuf<int32_t> pages(size_t(B) * Hkv * cap), counts(size_t(B) * Hkv);
  const Selection dsel{pages.p, counts.p, cap};
  out.poison(), lse.poison(), pages.poison();
  cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), f.sup->dview(), f.dtv, db, dqv,
                         {out.p, lse.p}, &dsel, nullptr);
  CK(cudaDeviceSynchronize());
  const float scale = plan.params.scale;

  // 1. Level 1 vs cpu::super_score.
  const auto gh = region<float>(ws, plan.super_scores, size_t(B) * Hq * f.MG);
  std::vector<float> ch(gh.size());
  const SuperView hs = f.sup->host.view();
  cpu::super_score(hs, f.htv, hb, hq, scale, c.two, ch.data());
  double worst1 = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < f.MG; ++j) {
        const size_t i = (size_t(b) * Hq + h) * f.MG + j;
        if (std::isinf(ch[i])) {
          ASSERT_TRUE(std::isinf(gh[i]) && gh[i] < 0) << "group " << i;
          continue;
        }
        const double tol = group_tol(hs, f.table[size_t(b) * f.MG + j], h / c.G,
                                     q.data() + (size_t(b) * Hq + h) * d, scale, P);
        ASSERT_NEAR(gh[i], ch[i], tol) << "b " << b << " h " << h << " group " << j;
        worst1 = std::max(worst1, std::fabs(double(gh[i]) - ch[i]) / tol);
      }
  ::testing::Test::RecordProperty("level1_worst_error_over_bound", std::to_string(worst1));

  // 2. The page list vs cpu::select_groups_list on the GPU's level-1 scores: identical.
  const auto map = region<int32_t>(ws, plan.page_map, size_t(B) * Hkv * Lc);
  const auto llen = region<int32_t>(ws, plan.list_lens, size_t(B));
  std::vector<int32_t> cmap(map.size()), clen(llen.size());
  cpu::select_groups_list(gh.data(), f.htv, hb, Hq, Hkv, P, S, c.sel, c.two, Lc, cmap.data(),
                          clen.data());
  ASSERT_EQ(map, cmap);
  ASSERT_EQ(llen, clen);
  // The same list from the public op.
  DevBuf<float> dgh(gh);
  DevBuf<int32_t> pmap(map.size()), plen(llen.size());
  pmap.poison();
  cuda::select_groups_list(dgh.p, f.dtv, db, Hq, Hkv, P, S, c.sel, c.two, Lc, pmap.p, plen.p,
                           nullptr);
  CK(cudaDeviceSynchronize());
  EXPECT_EQ(pmap.download(), map);
  EXPECT_EQ(plen.download(), llen);
  int two_level_rows = 0;
  for (int b = 0; b < B; ++b)
    two_level_rows += groups_kept(c.two, c.sel, P, S, hb.seq_lens[b]) >= 0;
  ::testing::Test::RecordProperty("two_level_sequences", std::to_string(two_level_rows));

  // 3. Level-2 scores of the listed pages vs the float64 page scores.
  const auto h2 = region<float>(ws, plan.head_scores, size_t(B) * Hq * Lc);
  std::vector<double> ref_hs(size_t(B) * Hq * f.M);
  const SummaryView hv = f.store.view();
  ref::score_pages(hv, hb, hq, scale, ref_hs.data());
  const test::ArithModel am = test::cuda_arith(DType::bf16);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int i = 0; i < Lc; ++i) {
        const int page = map[(size_t(b) * Hkv + h / c.G) * Lc + i];
        const float x = h2[(size_t(b) * Hq + h) * Lc + i];
        if (page < 0 || page >= hb.seq_lens[b] / P) {
          if (i < llen[b] / P) ADD_FAILURE() << "a listed full page unscored";
          continue;
        }
        const double r = ref_hs[(size_t(b) * Hq + h) * f.M + page];
        const int32_t blk = hb.block_table[int64_t(b) * hb.block_table_stride + page];
        const double tol = test::score_tolerance(hv, blk, h / c.G,
                                                 q.data() + (size_t(b) * Hq + h) * d, scale, r, am);
        ASSERT_NEAR(x, r, tol) << "b " << b << " h " << h << " position " << i;
      }

  // 4. Selection vs cpu aggregation + selection over positions on the GPU's level-2 scores,
  // mapped to pages: identical.
  std::vector<int32_t> lblk(size_t(B) * Hkv * Lc, 0);
  const BatchView lb{lblk.data(), int64_t(Hkv) * Lc, llen.data(), B, Lc};
  std::vector<float> agg(size_t(B) * Hkv * Lc);
  cpu::aggregate_gqa(h2.data(), lb, Hq, Hkv, agg.data());
  std::vector<int32_t> cp(size_t(B) * Hkv * cap), cc(size_t(B) * Hkv);
  cpu::select_pages(agg.data(), lb, Hkv, P, c.sel, Selection{cp.data(), cc.data(), cap});
  for (int row = 0; row < B * Hkv; ++row)
    for (int i = 0; i < cc[size_t(row)]; ++i) {
      int32_t& x = cp[size_t(row) * cap + i];
      x = map[size_t(row) * Lc + x];
    }
  const auto gp = pages.download(), gcnt = counts.download();
  EXPECT_EQ(gcnt, cc);
  EXPECT_EQ(gp, cp);

  // 5. Attention vs float64 on the GPU's selection.
  const auto o = out.download(), ls = lse.download();
  const Selection hsel{const_cast<int32_t*>(gp.data()), const_cast<int32_t*>(gcnt.data()), cap};
  for (size_t i = 0; i < o.size(); ++i) ASSERT_TRUE(std::isfinite(o[i])) << "output " << i;
  test::expect_attention_within_bound(f.gc.host.view(), hb, hq, scale, &hsel, o.data(), ls.data(),
                                      test::cuda_arith(f.gc.host.view().layout.dtype));

  // 6. The whole step vs cpu::decode_two_level: page sets, rows that differ counted (the
  // two backends' level-1 and level-2 scores differ in the last bits, so a near-tie may
  // flip; steps 2 and 4 are the exact checks).
  const DecodePlan cplan = cpu::plan_decode(f.params());
  std::vector<std::byte> cws(cplan.workspace_bytes + 256);
  void* cbase =
      reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(cws.data()) + 255) & ~uintptr_t(255));
  std::vector<float> co(o.size());
  std::vector<int32_t> cpp(gp.size()), ccc(gcnt.size());
  const Selection csel{cpp.data(), ccc.data(), cap};
  cpu::decode_two_level(cplan, {cbase, cplan.workspace_bytes}, f.gc.host.view(), f.store.view(),
                        f.sup->host.view(), f.htv, hb, hq, {co.data(), nullptr}, &csel);
  EXPECT_EQ(ccc, gcnt);
  int differing = 0;
  for (int row = 0; row < B * Hkv; ++row)
    differing += !std::equal(cpp.begin() + int64_t(row) * cap,
                             cpp.begin() + int64_t(row) * cap + ccc[size_t(row)],
                             gp.begin() + int64_t(row) * cap);
  ::testing::Test::RecordProperty("rows_differing_from_cpu", std::to_string(differing));
  EXPECT_LE(differing, (B * Hkv) / 4) << "more rows than near-ties explain";

  // 7. CUDA graph: capture the step, replay with a new query; equal to a direct call.
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), f.sup->dview(), f.dtv, db, dqv,
                         {out.p, lse.p}, &dsel, st);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  const std::vector<float> q2 = random_queries(B, Hq, d, 1.5f, 6);
  dq.upload(q2);
  out.poison(), pages.poison();
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  const auto go = out.download();
  const auto ggp = pages.download(), ggc = counts.download();
  out.poison(), pages.poison();
  cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), f.sup->dview(), f.dtv, db, dqv,
                         {out.p, lse.p}, &dsel, st);
  CK(cudaStreamSynchronize(st));
  EXPECT_EQ(ggp, pages.download());
  EXPECT_EQ(ggc, counts.download());
  EXPECT_EQ(go, out.download());
  EXPECT_NE(go, o) << "the replay used the new query";
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaStreamDestroy(st));
}

TwoLevelConfig cfg(double alpha, int first) {
  TwoLevelConfig t;
  t.alpha = alpha;
  t.min_groups = 4;
  t.first_groups = first;
  t.flat_below_groups = 8;
  return t;
}

// Ragged: two-level sequences (24 and 20 groups of 8 pages, one with a partial tail and an
// open group), a short one (flat fallback), one ending on a group edge.
const std::vector<int64_t> kLens = {16 * 8 * 24 + 16 * 3 + 5, 16 * 8 * 20, 300, 16 * 8 * 16};

TEST(CudaTwoLevel, LlamaShapeStageByStage) {
  SKIP_WITHOUT_GPU();
  run_case({8, 4, cfg(2.0, 1), {256, 1, 2}}, kLens);
}

TEST(CudaTwoLevel, GlmShapeStageByStage) {
  SKIP_WITHOUT_GPU();
  run_case({2, 16, cfg(2.0, 1), {256, 1, 2}}, kLens);
}

// flat_below_groups above the kept groups (22 > m + F): the 20- and 16-group rows and
// the short one score every page (the level-2 list grows to (22 + 1) x 8 = 184 positions to hold
// them), the 24-group row stays two-level.
TEST(CudaTwoLevel, FlatBelowGroupsGrowsTheList) {
  SKIP_WITHOUT_GPU();
  TwoLevelConfig t = cfg(2.0, 1);
  t.flat_below_groups = 22;
  run_case({8, 4, t, {256, 1, 2}}, kLens);
}

// The same stages over super summaries the GPU built (cuda::super_build) from the cache.
TEST(CudaTwoLevel, GpuBuiltSuperSummaries) {
  SKIP_WITHOUT_GPU();
  Case c{8, 4, cfg(2.0, 1), {256, 1, 2}};
  c.gpu_supers = true;
  run_case(c, kLens);
  c = {2, 16, cfg(4.0, 1), {384, 0, 2}};
  c.gpu_supers = true;
  run_case(c, kLens);
}

TEST(CudaTwoLevel, NoSinkRecentAndOtherModes) {
  SKIP_WITHOUT_GPU();
  TwoLevelConfig t = cfg(4.0, 1);
  run_case({4, 4, t, {384, 0, 0}}, kLens);
  t.use_extent = false;  // centroid mode, max aggregation
  t.agg = GroupAgg::max;
  run_case({4, 4, t, {256, 2, 9}}, kLens);
  t.use_extent = true;  // mixed estimate, gamma
  t.mix = true;
  t.gamma = 0.5;
  t.agg = GroupAgg::lse;
  run_case({4, 2, t, {256, 0, 3}}, kLens);
}

// Level 1 alone over the kernel's instances and paths (super_score.cu): head dims 32-256
// (one to eight words a lane; 66 pads the k-steps and reads bytes), ranks 3-16 (8- and
// 16-row instances, rows past the rank, per-page rows read by bytes when the rank is not
// the instance's), 8 / 32 / 64 pages a group (one or two pages a lane), groups 1-32 (padded
// passes, several passes), every estimate, LSE and max, gamma, and arrays at odd addresses
// (byte loads), extents in either order; random codes; vs cpu::super_score within group_tol.
struct L1Case {
  int d, R, S, Hkv, G;
  bool extent, mix;
  GroupAgg agg;
  double gamma;
  bool misalign;
  bool unordered = false;  // extents with lo > hi (not from a build: memory the caller wrote)
};

template <typename T>
void fill_random(T* p, size_t n, test::Rng& rng, int lo, int hi) {
  for (size_t i = 0; i < n; ++i) p[i] = T(rng.integer(lo, hi));
}
void fill_scales(float* p, size_t n, test::Rng& rng, float lo, float hi) {
  for (size_t i = 0; i < n; ++i) p[i] = rng.uniform(lo, hi);
}

void run_level1(const L1Case& c, uint64_t seed) {
  constexpr int P = 16;
  const int B = 3, Hq = c.Hkv * c.G, d = c.d, R = c.R, S = c.S;
  SuperLayout l;
  l.num_slots = 40;
  l.group_pages = S;
  l.page_size = P;
  l.num_kv_heads = c.Hkv;
  l.head_dim = d;
  l.rank = R;
  l.extent = c.extent;
  GpuSupers sup(l);
  test::Rng rng(seed);
  {
    const SuperView v = sup.host.view();
    const size_t gh = size_t(l.num_slots) * c.Hkv;
    fill_random(v.mu_q, gh * d, rng, -127, 127);
    fill_scales(v.mu_scale, gh, rng, 0.002f, 0.02f);
    fill_random(v.basis_q, gh * R * d / 2, rng, 0, 255);
    fill_scales(v.basis_scale, gh * R, rng, 0.01f, 0.05f);
    fill_random(v.coord_q, gh * S * R, rng, -127, 127);
    fill_scales(v.coord_scale, gh * R, rng, 0.01f, 0.1f);
    fill_random(v.radius_q, gh * S, rng, 0, 255);
    fill_scales(v.radius_scale, gh, rng, 0.001f, 0.01f);
    if (c.extent) {
      fill_random(v.lo_q, gh * S * R, rng, -127, 127);
      fill_random(v.hi_q, gh * S * R, rng, -127, 127);
      for (size_t i = 0; i < gh * S * R && !c.unordered; ++i)
        if (v.lo_q[i] > v.hi_q[i]) std::swap(v.lo_q[i], v.hi_q[i]);
      fill_scales(v.extent_scale, gh * R, rng, 0.01f, 0.1f);
    }
  }
  sup.upload();
  SuperView dv = sup.dview();
  // Odd-address copies of the basis, centroid and per-page rows: the kernel's byte loads.
  DevBuf<uint8_t> odd_basis, odd_mu, odd_hi;
  if (c.misalign) {
    auto odd = [](DevBuf<uint8_t>& buf, const void* src, size_t n) {
      buf = DevBuf<uint8_t>(n + 1);
      CK(cudaMemcpy(buf.p + 1, src, n, cudaMemcpyDeviceToDevice));
      return buf.p + 1;
    };
    const size_t gh = size_t(l.num_slots) * c.Hkv;
    dv.basis_q = odd(odd_basis, dv.basis_q, gh * R * d / 2);
    dv.mu_q = reinterpret_cast<int8_t*>(odd(odd_mu, dv.mu_q, gh * d));
    if (c.extent) dv.hi_q = reinterpret_cast<int8_t*>(odd(odd_hi, dv.hi_q, gh * S * R));
  }
  // Three sequences: 7 complete groups and a partial one, 3 exactly, none; random slots.
  const std::vector<int32_t> lens = {S * P * 7 + 3 * P + 5, S * P * 3, P * 2 + 1};
  const int M = S * 8 + 1, MG = (M + S - 1) / S;
  std::vector<int32_t> table(size_t(B) * MG, -1), bt(size_t(B) * M, 0);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < lens[b] / P / S; ++j)
      table[size_t(b) * MG + j] = rng.integer(0, int(l.num_slots) - 1);
  DevBuf<int32_t> dtable(table), dlens(lens), dbt(bt);
  const BatchView hb{bt.data(), M, lens.data(), B, M}, db{dbt.p, M, dlens.p, B, M};
  const SuperTableView htv{table.data(), MG, MG}, dtv{dtable.p, MG, MG};
  const std::vector<float> q = random_queries(B, Hq, d, 1.5f, seed + 1);
  DevBuf<float> dq(q);
  TwoLevelConfig cfg;
  cfg.use_extent = c.extent;
  cfg.mix = c.mix;
  cfg.agg = c.agg;
  cfg.gamma = c.gamma;
  const float scale = 1.0f / std::sqrt(float(d));
  DevBuf<float> out(size_t(B) * Hq * MG);
  out.poison();
  cuda::super_score(dv, dtv, db, {dq.p, Hq}, scale, cfg, out.p, nullptr);
  CK(cudaDeviceSynchronize());
  const std::vector<float> gh = out.download();
  std::vector<float> ch(gh.size());
  const SuperView hs = sup.host.view();
  cpu::super_score(hs, htv, hb, {q.data(), Hq}, scale, cfg, ch.data());
  double worst = 0;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h)
      for (int j = 0; j < MG; ++j) {
        const size_t i = (size_t(b) * Hq + h) * MG + j;
        if (std::isinf(ch[i])) {
          ASSERT_TRUE(std::isinf(gh[i]) && gh[i] < 0) << "b " << b << " h " << h << " j " << j;
          continue;
        }
        const double tol = group_tol(hs, table[size_t(b) * MG + j], h / c.G,
                                     q.data() + (size_t(b) * Hq + h) * d, scale, P);
        ASSERT_NEAR(gh[i], ch[i], tol) << "d " << d << " R " << R << " S " << S << " G " << c.G
                                       << ": b " << b << " h " << h << " group " << j;
        worst = std::max(worst, std::fabs(double(gh[i]) - ch[i]) / tol);
      }
  ::testing::Test::RecordProperty("level1_worst_error_over_bound", std::to_string(worst));
}

TEST(CudaTwoLevel, Level1EveryInstanceAndPath) {
  SKIP_WITHOUT_GPU();
  const GroupAgg L = GroupAgg::lse, X = GroupAgg::max;
  const std::vector<L1Case> cases = {
      {128, 8, 32, 8, 4, true, false, L, 0.0, false},        // Llama-3.1-8B, the bench's default
      {128, 8, 32, 2, 16, true, false, L, 0.0, false},       // GLM-4-9B: 4 passes
      {256, 8, 32, 1, 4, true, true, L, 0.5, false},         // Gemma-3 global: 8 words a lane
      {64, 8, 8, 2, 16, false, false, X, 0.0, false},        // centroid, max, 2 words a lane
      {96, 5, 64, 3, 7, true, false, L, 0.0, false},         // 3 words, rows past the rank, 2 pages
      {128, 16, 64, 2, 2, true, true, L, 0.5, false},        // 16 rows, 2 pages a lane, mixed
      {128, 12, 32, 2, 32, true, false, L, 0.0, false},      // 16 rows, 8 passes
      {66, 8, 16, 2, 3, true, false, X, 0.0, false},         // padded k-steps, byte loads
      {32, 3, 8, 4, 1, false, false, L, 0.25, false},        // one word a lane, one head
      {160, 8, 32, 2, 4, true, false, L, 0.0, false},        // 5 words a lane (4-byte loads)
      {128, 8, 32, 2, 4, true, true, L, 0.0, true},          // odd addresses: byte loads
      {128, 8, 32, 2, 8, true, false, L, 0.0, false, true},  // lo > hi: still max(w hi, w lo)
  };
  uint64_t seed = 100;
  for (const L1Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "d " << c.d << " R " << c.R << " S " << c.S << " Hkv "
                                      << c.Hkv << " G " << c.G);
    run_level1(c, seed += 7);
    if (HasFatalFailure()) return;
  }
}

TEST(CudaTwoLevel, BadCallsAreRefused) {
  SKIP_WITHOUT_GPU();
  Fixture f({2, 4, cfg(2.0, 1), {256, 1, 2}}, kLens);
  DecodeParams p = f.params();
  p.select.tau = 0.5f;
  EXPECT_THROW(cuda::plan_decode(p), InvalidArgument);
  const DecodePlan plan = cuda::plan_decode(f.params());
  DevBuf<uint8_t> wsb(plan.workspace_bytes);
  const Workspace ws{wsb.p, plan.workspace_bytes};
  DevBuf<float> q(size_t(f.B) * f.Hq * Fixture::d), out(q.n);
  SuperTableView short_table = f.dtv;
  short_table.max_groups_per_seq = plan.max_groups - 1;
  EXPECT_THROW(
      cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), f.sup->dview(), short_table,
                             f.gc.dbatch(), {q.p, f.Hq}, {out.p, nullptr}, nullptr, nullptr),
      InvalidArgument);
  SuperView no_ext = f.sup->dview();
  no_ext.hi_q = nullptr;
  EXPECT_THROW(
      cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), no_ext, f.dtv, f.gc.dbatch(),
                             {q.p, f.Hq}, {out.p, nullptr}, nullptr, nullptr),
      InvalidArgument);
  SuperView other = f.sup->dview();
  other.layout.group_pages = 16;
  EXPECT_THROW(
      cuda::decode_two_level(plan, ws, f.gc.dview(), f.gs.view(), other, f.dtv, f.gc.dbatch(),
                             {q.p, f.Hq}, {out.p, nullptr}, nullptr, nullptr),
      InvalidArgument);
}

}  // namespace
}  // namespace locks::cuda_test
