// cuda::super_build against cpu::super_build (super_summary.h) on the same keys.
//
// Where the group's top R + 1 covariance eigenvalues are distinct (planted spectrum) the
// basis is unique up to sign, which both builds fix the same way, so every dequantized field
// must agree within 1.5 quantization steps: the fp32 arithmetic of the GPU (covariance sums
// of S * 16 terms, the subspace iteration's stopping rule at a 1e-3 relative change of the
// captured variance, <= 7e-6 of it left uncaptured on real keys) moves a value by ~1e-4 of
// its scale or less, so the two can differ by one step only where a value sits at a rounding
// boundary. Where eigenvalues are close (i.i.d. keys) the basis is not unique: there the GPU
// basis must capture as much of the group's variance as the CPU's (within 3%; a wrong
// subspace captures ~half). Degenerate groups (constant keys, rank below R) are compared by
// their level-1 estimates. Bad device values: skipped groups keep their bytes, a non-finite
// key poisons the scales of its group only.
#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>

#include "gpu_helpers.h"
#include "gpu_supers.h"
#include "locks/error.h"
#include "locks/super_summary.h"

// Its own namespace: the test target is a unity build (names of other files in one TU).
namespace locks::cuda_test::super_build_test {
namespace {

constexpr int P = 16;

struct Shape {
  int d, H, S, R;
  DType dtype;
  bool extent;
};

enum class Keys { planted, iid, constant, rank3 };

// Keys of n_groups groups of S pages, [tokens, H, d]: "planted" = a group mean, R + 2
// directions with distinct amplitudes 1.0 * 0.8^r (page centres and keys both spread along
// them), plus isotropic noise 0.02; "iid" = Gaussian noise around per-page centres; "constant"
// = one key repeated; "rank3" = mean + 3 directions, no noise.
std::vector<float> make_group_keys(const Shape& s, int n_groups, Keys kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const int d = s.d, H = s.H, S = s.S;
  const int64_t tokens = int64_t(n_groups) * S * P;
  std::vector<float> k(size_t(tokens) * H * d);
  const int dirs = kind == Keys::rank3 ? 3 : s.R + 2;
  for (int g = 0; g < n_groups; ++g)
    for (int h = 0; h < H; ++h) {
      std::vector<float> mean(d), u(size_t(dirs) * d);
      for (auto& x : mean) x = 0.5f * N(rng);
      for (auto& x : u) x = N(rng) / std::sqrt(float(d));
      for (int p = 0; p < S; ++p) {
        std::vector<float> centre = mean, pa(dirs);
        for (int r = 0; r < dirs; ++r) pa[r] = N(rng);
        if (kind == Keys::iid)
          for (auto& x : centre) x += 0.3f * N(rng);
        for (int t = 0; t < P; ++t) {
          const int64_t tok = (int64_t(g) * S + p) * P + t;
          float* row = k.data() + (size_t(tok) * H + h) * d;
          for (int c = 0; c < d; ++c) row[c] = centre[c];
          if (kind == Keys::constant) continue;
          if (kind == Keys::iid) {
            for (int c = 0; c < d; ++c) row[c] += N(rng);
            continue;
          }
          for (int r = 0; r < dirs; ++r) {
            const float amp = std::pow(0.8f, float(r)) * (0.6f * pa[r] + 0.8f * N(rng));
            for (int c = 0; c < d; ++c) row[c] += amp * u[size_t(r) * d + c];
          }
          if (kind == Keys::planted)
            for (int c = 0; c < d; ++c) row[c] += 0.02f * N(rng);
        }
      }
    }
  return k;
}

SuperLayout layout_of(const Shape& s, int64_t slots) {
  SuperLayout l;
  l.num_slots = slots;
  l.group_pages = s.S;
  l.page_size = P;
  l.num_kv_heads = s.H;
  l.head_dim = s.d;
  l.rank = s.R;
  l.extent = s.extent;
  return l;
}

struct Built {
  GpuCache gc;
  std::vector<int32_t> group_blocks, slots;
  DevBuf<int32_t> dblocks, dslots;
  std::unique_ptr<GpuSupers> cpu, gpu;
  std::vector<float> keys;

  Built(const Shape& s, int n_groups, Keys kind, uint64_t seed)
      : gc(CacheLayout{int64_t(n_groups) * s.S + 3, P, s.H, s.d, s.dtype}) {
    keys = make_group_keys(s, n_groups, kind, seed);
    std::vector<float> v(keys.size(), 0.0f);
    gc.add(keys, v, int64_t(n_groups) * s.S * P);
    gc.sync();
    const std::vector<int32_t>& bl = gc.host.blocks(0);
    for (int g = 0; g < n_groups; ++g) {
      slots.push_back(int32_t(n_groups - 1 - g));  // slots in reverse: the map is honoured
      for (int p = 0; p < s.S; ++p) group_blocks.push_back(bl[size_t(g) * s.S + p]);
    }
    dblocks = DevBuf<int32_t>(group_blocks);
    dslots = DevBuf<int32_t>(slots);
    const SuperLayout l = layout_of(s, n_groups);
    cpu = std::make_unique<GpuSupers>(l);
    gpu = std::make_unique<GpuSupers>(l);
    cpu::super_build(gc.host.view(), group_blocks.data(), slots.data(), n_groups, cpu->host.view());
    gpu->upload();
  }
  void build_gpu(int64_t n) {
    cuda::super_build(gc.dview(), dblocks.p, dslots.p, n, gpu->dview(), nullptr);
    CK(cudaDeviceSynchronize());
    gpu->download();
  }
};

// Dequantized (slot, head) of both builds within 1.5 steps, GPU basis rows sign-aligned to
// the CPU's (the canonical sign can differ only at a near-tie of two components).
void expect_fields_close(const SuperView& a, const SuperView& b, int slot, int head,
                         const std::string& what) {
  const SuperLayout& l = a.layout;
  const int d = l.head_dim, R = l.rank, S = l.group_pages;
  const int64_t gh = int64_t(slot) * l.num_kv_heads + head;
  const SuperGroupF ga = super_dequantize(a, slot, head), gb = super_dequantize(b, slot, head);
  auto steps = [](float sa, float sb) { return 1.5 * std::max(sa, sb) + 1e-7; };
  const double tmu = steps(a.mu_scale[gh], b.mu_scale[gh]);
  for (int c = 0; c < d; ++c) ASSERT_NEAR(ga.mu[c], gb.mu[c], tmu) << what << " mu " << c;
  for (int k = 0; k < R; ++k) {
    double dot = 0;
    for (int c = 0; c < d; ++c)
      dot += double(ga.basis[size_t(k) * d + c]) * gb.basis[size_t(k) * d + c];
    const float sg = dot < 0 ? -1.0f : 1.0f;
    const double tb = steps(a.basis_scale[gh * R + k], b.basis_scale[gh * R + k]);
    for (int c = 0; c < d; ++c)
      ASSERT_NEAR(ga.basis[size_t(k) * d + c], sg * gb.basis[size_t(k) * d + c], tb)
          << what << " basis " << k << "," << c;
    const double tc = steps(a.coord_scale[gh * R + k], b.coord_scale[gh * R + k]);
    for (int p = 0; p < S; ++p)
      ASSERT_NEAR(ga.coord[size_t(p) * R + k], sg * gb.coord[size_t(p) * R + k], tc)
          << what << " coord " << p << "," << k;
    if (l.extent) {
      const double te = steps(a.extent_scale[gh * R + k], b.extent_scale[gh * R + k]);
      for (int p = 0; p < S; ++p) {
        const size_t i = size_t(p) * R + k;
        ASSERT_NEAR(ga.lo[i], sg > 0 ? gb.lo[i] : -gb.hi[i], te) << what << " lo " << p << "," << k;
        ASSERT_NEAR(ga.hi[i], sg > 0 ? gb.hi[i] : -gb.lo[i], te) << what << " hi " << p << "," << k;
      }
    }
  }
  const double tr = steps(a.radius_scale[gh], b.radius_scale[gh]);
  for (int p = 0; p < S; ++p)
    ASSERT_NEAR(ga.radius[p], gb.radius[p], tr) << what << " radius " << p;
}

std::string name(const Shape& s) {
  return "d " + std::to_string(s.d) + " H " + std::to_string(s.H) + " S " + std::to_string(s.S) +
         " R " + std::to_string(s.R) + " dtype " + std::to_string(int(s.dtype));
}

TEST(CudaSuperBuild, PlantedSpectrumMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{128, 2, 32, 8, DType::bf16, true}, {64, 3, 8, 4, DType::f16, true},
                          {256, 1, 16, 8, DType::f32, true},  {128, 1, 64, 8, DType::bf16, false},
                          {64, 1, 2, 1, DType::f32, true},    {256, 2, 5, 6, DType::bf16, true}};
  uint64_t seed = 11;
  for (const Shape& s : shapes) {
    Built b(s, 3, Keys::planted, seed++);
    b.build_gpu(3);
    for (int slot = 0; slot < 3; ++slot)
      for (int h = 0; h < s.H; ++h)
        expect_fields_close(b.cpu->host.view(), b.gpu->host.view(), slot, h,
                            name(s) + " slot " + std::to_string(slot));
  }
}

// Variance of the group's keys captured by the (dequantized, row-normalised) basis, and the
// best any R directions capture (the top R eigenvalues), from the keys in double.
struct Captured {
  double basis, best;
};
Captured captured(const std::vector<float>& keys, const Shape& s, int group, int head,
                  const SuperGroupF& g) {
  const int N = s.S * P, d = s.d;
  Eigen::MatrixXd K(N, d);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < d; ++c)
      K(n, c) = keys[(size_t(int64_t(group) * N + n) * s.H + head) * d + c];
  const Eigen::MatrixXd D = K.rowwise() - K.colwise().mean();
  const Eigen::MatrixXd C = D.transpose() * D / double(N);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(C);
  Captured r{0, 0};
  for (int k = 0; k < s.R; ++k) r.best += eig.eigenvalues()(d - 1 - k);
  // The quantized rows are not exactly orthogonal: project onto their orthonormalised span.
  Eigen::MatrixXd W(d, s.R);
  for (int k = 0; k < s.R; ++k)
    for (int c = 0; c < d; ++c) W(c, k) = g.basis[size_t(k) * d + c];
  const Eigen::MatrixXd Q =
      Eigen::HouseholderQR<Eigen::MatrixXd>(W).householderQ() * Eigen::MatrixXd::Identity(d, s.R);
  r.basis = (Q.transpose() * C * Q).trace();
  return r;
}

TEST(CudaSuperBuild, CloseEigenvaluesCaptureTheVariance) {
  SKIP_WITHOUT_GPU();
  const Shape shapes[] = {{128, 2, 32, 8, DType::bf16, true},
                          {256, 1, 32, 8, DType::f16, true},
                          {64, 1, 8, 8, DType::f32, true}};
  uint64_t seed = 101;
  for (const Shape& s : shapes) {
    Built b(s, 2, Keys::iid, seed++);
    b.build_gpu(2);
    for (int g = 0; g < 2; ++g)
      for (int h = 0; h < s.H; ++h) {
        const int slot = b.slots[g];
        const Captured cg =
            captured(b.keys, s, g, h, super_dequantize(b.gpu->host.view(), slot, h));
        const Captured cc =
            captured(b.keys, s, g, h, super_dequantize(b.cpu->host.view(), slot, h));
        EXPECT_GE(cg.basis, 0.97 * cc.basis) << name(s) << " group " << g << " head " << h;
        EXPECT_GE(cg.basis, 0.9 * cg.best) << name(s) << " group " << g << " head " << h;
      }
  }
}

// Rank-deficient groups (constant keys; 3 directions for R 8): the basis is free beyond the
// rank, so compare what level 1 computes from it: every page's estimate for random queries.
TEST(CudaSuperBuild, DegenerateGroupsGiveTheSameEstimates) {
  SKIP_WITHOUT_GPU();
  const Shape s{128, 2, 16, 8, DType::bf16, true};
  for (Keys kind : {Keys::constant, Keys::rank3}) {
    Built b(s, 2, kind, 7);
    b.build_gpu(2);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> N(0.f, 1.f);
    TwoLevelConfig cfg;
    for (int trial = 0; trial < 8; ++trial) {
      std::vector<float> q(s.d);
      for (auto& x : q) x = N(rng);
      for (int slot = 0; slot < 2; ++slot)
        for (int h = 0; h < s.H; ++h)
          for (int p = 0; p < s.S; ++p) {
            const double ec =
                ref::super_page_estimate(b.cpu->host.view(), slot, h, p, q.data(), 0.1f, cfg);
            const double eg =
                ref::super_page_estimate(b.gpu->host.view(), slot, h, p, q.data(), 0.1f, cfg);
            // mu codes equal within a step: |q| |mu step| d^0.5 scale; the extent terms of the
            // rank-3 group within 1.5 steps of |w| each.
            ASSERT_NEAR(ec, eg, 0.05 * (1.0 + std::fabs(ec)))
                << "kind " << int(kind) << " slot " << slot << " page " << p;
          }
    }
  }
}

TEST(CudaSuperBuild, Deterministic) {
  SKIP_WITHOUT_GPU();
  const Shape s{128, 2, 32, 8, DType::bf16, true};
  Built b(s, 4, Keys::iid, 5);
  b.build_gpu(4);
  const std::vector<int8_t> first = b.gpu->mu_q.download();
  const std::vector<uint8_t> basis = b.gpu->basis_q.download();
  const std::vector<int8_t> lo = b.gpu->lo_q.download();
  const std::vector<float> sc = b.gpu->basis_scale.download();
  b.gpu->mu_q.poison(), b.gpu->basis_q.poison(), b.gpu->lo_q.poison(), b.gpu->basis_scale.poison();
  b.build_gpu(4);
  EXPECT_EQ(first, b.gpu->mu_q.download());
  EXPECT_EQ(basis, b.gpu->basis_q.download());
  EXPECT_EQ(lo, b.gpu->lo_q.download());
  const std::vector<float> sc2 = b.gpu->basis_scale.download();
  EXPECT_EQ(0, std::memcmp(sc.data(), sc2.data(), sc.size() * sizeof(float)));
}

// Out-of-range slot or block id: that group is skipped (its bytes untouched), the others are
// built; a non-finite key: its group's scales are NaN and its codes 0, the others are finite.
TEST(CudaSuperBuild, BadDeviceValues) {
  SKIP_WITHOUT_GPU();
  const Shape s{64, 2, 8, 4, DType::f32, true};
  Built b(s, 4, Keys::planted, 9);
  std::vector<int32_t> blocks = b.group_blocks, slots = b.slots;
  slots[1] = 4;                      // slot out of range: group 1 skipped
  blocks[size_t(2) * s.S + 3] = -1;  // block id out of range: group 2 skipped
  b.dblocks.upload(blocks);
  b.dslots.upload(slots);
  b.gpu->mu_scale.poison();
  b.gpu->basis_q.poison();
  b.build_gpu(4);
  const SuperView g = b.gpu->host.view();
  for (int slot : {b.slots[1], b.slots[2]})
    for (int h = 0; h < s.H; ++h) {
      uint32_t bits;
      std::memcpy(&bits, &g.mu_scale[slot * s.H + h], 4);
      EXPECT_EQ(bits, 0xffffffffu) << "skipped slot " << slot << " was written";
      EXPECT_EQ(g.basis_q[size_t(slot * s.H + h) * s.R * s.d / 2], 0xff);
    }
  for (int gi : {0, 3})
    for (int h = 0; h < s.H; ++h)
      expect_fields_close(b.cpu->host.view(), g, b.slots[gi], h,
                          "good group " + std::to_string(gi));

  // A NaN key in group 0, head 1: the group's (slot, head 1) is poisoned, head 0 is not.
  const CacheLayout& L = b.gc.host.layout();
  const size_t off = (size_t(b.group_blocks[5]) * L.block_elems() + size_t(7 * s.H + 1) * s.d + 3);
  const float nan = std::nanf("");
  CK(cudaMemcpy(b.gc.k.p + off * sizeof(float), &nan, sizeof(float), cudaMemcpyHostToDevice));
  b.dblocks.upload(b.group_blocks);
  b.dslots.upload(b.slots);
  b.build_gpu(4);
  const int slot0 = b.slots[0];
  EXPECT_TRUE(std::isnan(g.mu_scale[slot0 * s.H + 1]));
  EXPECT_TRUE(std::isnan(g.radius_scale[slot0 * s.H + 1]));
  for (int k = 0; k < s.R; ++k) {
    EXPECT_TRUE(std::isnan(g.basis_scale[(slot0 * s.H + 1) * s.R + k]));
    EXPECT_TRUE(std::isnan(g.extent_scale[(slot0 * s.H + 1) * s.R + k]));
  }
  for (int c = 0; c < s.d; ++c) EXPECT_EQ(g.mu_q[size_t(slot0 * s.H + 1) * s.d + c], 0);
  EXPECT_TRUE(std::isfinite(g.mu_scale[slot0 * s.H]));
  expect_fields_close(b.cpu->host.view(), g, slot0, 0, "head 0 beside the NaN head");
}

// super_build_filled inside a CUDA graph: each sequence whose last `appended` tokens completed
// a group gets that group built into its table slot (equal to cpu::super_build of the same
// blocks); every other slot keeps its bytes; then a wider `appended` crosses one more edge.
TEST(CudaSuperBuild, FilledBuildsCompletedGroupsInAGraph) {
  SKIP_WITHOUT_GPU();
  const Shape s{128, 2, 8, 8, DType::bf16, true};
  const int gt = s.S * P;
  const std::vector<int64_t> lens = {2 * gt, 2 * gt + 5, gt, 100, 3 * gt};
  int64_t blocks = 0;
  for (int64_t l : lens) blocks += (l + P - 1) / P;
  GpuCache gc(CacheLayout{blocks + 2, P, s.H, s.d, s.dtype});
  gc.add_structured(lens, 31);
  const BatchView db = gc.dbatch(), hb = gc.batch.view;
  const int B = int(lens.size()), MG = (hb.max_blocks_per_seq + s.S - 1) / s.S;
  std::vector<int32_t> table(size_t(B) * MG);
  for (size_t i = 0; i < table.size(); ++i) table[i] = int32_t(i);
  DevBuf<int32_t> dtable(table);
  const SuperLayout l = layout_of(s, int64_t(B) * MG);
  GpuSupers gpu(l), cpu(l);
  gpu.upload();
  gpu.mu_scale.poison(), gpu.basis_q.poison();
  // The CPU build of every complete group of every sequence, in its slot.
  std::vector<int32_t> gb, gs;
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < hb.seq_lens[b] / gt; ++g) {
      gs.push_back(b * MG + g);
      for (int p = 0; p < s.S; ++p)
        gb.push_back(hb.block_table[int64_t(b) * hb.block_table_stride + g * s.S + p]);
    }
  cpu::super_build(gc.host.view(), gb.data(), gs.data(), int64_t(gs.size()), cpu.host.view());

  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const SuperTableView tv{dtable.p, MG, MG};
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  cuda::super_build_filled(gc.dview(), db, 1, tv, gpu.dview(), st);
  CK(cudaStreamEndCapture(st, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  CK(cudaGraphLaunch(exec, st));
  CK(cudaStreamSynchronize(st));
  gpu.download();
  const SuperView gv = gpu.host.view();
  auto written = [&](int slot, int h) {
    uint32_t bits;
    std::memcpy(&bits, &gv.mu_scale[slot * s.H + h], 4);
    return bits != 0xffffffffu;
  };
  // appended 1: sequences 0 (group 1), 2 (group 0) and 4 (group 2) completed a group.
  const std::vector<std::pair<int, int>> built = {{0, 1}, {2, 0}, {4, 2}};
  for (int b = 0; b < B; ++b)
    for (int g = 0; g < MG; ++g)
      for (int h = 0; h < s.H; ++h) {
        const bool want =
            std::find(built.begin(), built.end(), std::make_pair(b, g)) != built.end();
        ASSERT_EQ(written(b * MG + g, h), want) << "sequence " << b << " group " << g;
        if (want)
          expect_fields_close(cpu.host.view(), gv, b * MG + g, h,
                              "filled, sequence " + std::to_string(b));
      }
  // appended 20: sequence 1 (2 gt + 5 tokens) crossed the edge of group 1 too.
  gpu.mu_scale.poison();
  cuda::super_build_filled(gc.dview(), db, 20, tv, gpu.dview(), st);
  CK(cudaStreamSynchronize(st));
  gpu.download();
  for (int h = 0; h < s.H; ++h) {
    EXPECT_TRUE(written(1 * MG + 1, h));
    expect_fields_close(cpu.host.view(), gv, 1 * MG + 1, h, "filled, appended 20");
    EXPECT_FALSE(written(3 * MG + 0, h));  // 100 tokens: no group
  }
  EXPECT_THROW(cuda::super_build_filled(gc.dview(), db, 0, tv, gpu.dview(), st), Error);
  EXPECT_THROW(cuda::super_build_filled(gc.dview(), db, gt + 1, tv, gpu.dview(), st), Error);
  EXPECT_THROW(cuda::super_build_filled(gc.dview(), db, 1, {dtable.p, MG, MG - 1}, gpu.dview(), st),
               Error);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  CK(cudaStreamDestroy(st));
}

TEST(CudaSuperBuild, HostChecks) {
  SKIP_WITHOUT_GPU();
  const Shape s{128, 1, 8, 8, DType::bf16, true};
  Built b(s, 1, Keys::planted, 1);
  const KvCacheView cache = b.gc.dview();
  SuperView v = b.gpu->dview();
  EXPECT_NO_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, 0, v, nullptr));
  EXPECT_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, -1, v, nullptr), Error);
  EXPECT_THROW(cuda::super_build(cache, nullptr, b.dslots.p, 1, v, nullptr), Error);
  SuperView nul = v;
  nul.coord_q = nullptr;
  EXPECT_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, 1, nul, nullptr), Error);
  SuperView other = v;
  other.layout.head_dim = 64;
  EXPECT_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, 1, other, nullptr), Error);
  SuperView r16 = v;
  r16.layout.rank = 16;
  EXPECT_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, 1, r16, nullptr), Unsupported);
  SuperView s128 = v;
  s128.layout.group_pages = 128;
  EXPECT_THROW(cuda::super_build(cache, b.dblocks.p, b.dslots.p, 1, s128, nullptr), Unsupported);
  EXPECT_FALSE(cuda::super_build_supported(r16.layout));
  EXPECT_TRUE(cuda::super_build_supported(v.layout));
}

}  // namespace
}  // namespace locks::cuda_test::super_build_test
