// The two-level step's group choice (cuda::select_groups_list, super.cu) on its own: for every
// cluster size (1, 2, 4, 8 blocks a row, where it holds the row) the same page list, list
// lengths and listed block ids, bit for bit, and the list equal to cpu::select_groups_list's
// (computed in double). Scores are drawn so that the float32 share-averaging cannot reorder
// two groups (distinct values 0.003 apart), or with many exact ties (equal score vectors give
// equal keys on the GPU: ties across block spans go to the lower index), with -inf groups
// and -inf heads, over rows that span many 256-group slices and odd row lengths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_helpers.h"
#include "locks/contract.h"
#include "locks/plan.h"
#include "locks/super_summary.h"
#include "test_util.h"

namespace locks {
namespace {

using cuda_test::DevBuf;

struct ChoiceCase {
  const char* name;
  int Hq, Hkv, S, MG, budget, sink, recent, first_groups;
  bool ties;                  // scores on a coarse grid: many exactly equal groups
  std::vector<int32_t> lens;  // in tokens (P 16); each in [1, MG S P]
};

constexpr int kP = 16;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> choice_scores(const ChoiceCase& c, uint64_t seed) {
  test::Rng rng(seed);
  const int B = int(c.lens.size()), G = c.Hq / c.Hkv;
  std::vector<float> gh(size_t(B) * c.Hq * c.MG);
  for (int b = 0; b < B; ++b)
    for (int kv = 0; kv < c.Hkv; ++kv) {
      // A random order of the groups (distinct) or a coarse grid of 37 values (ties).
      std::vector<int> perm(size_t(c.MG));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng.engine());
      for (int g = 0; g < G; ++g) {
        const int hq = kv * G + g;
        const float offset = 3.0f * rng.normal();  // cancels in the head's LSE
        const bool dead_head = G > 1 && g == G - 1 && (b + kv) % 3 == 2;
        float* s = gh.data() + (size_t(b) * c.Hq + hq) * c.MG;
        for (int j = 0; j < c.MG; ++j) {
          const int p = perm[size_t(j)];
          if (dead_head || p % 97 == 5) {  // a head or a group with no mass
            s[j] = -kInf;
            continue;
          }
          // Per-head detail (distinct mode) small against the 0.003 spacing.
          s[j] = c.ties ? 0.05f * float(p % 37) + offset
                        : 0.003f * float(p) + offset + 0.0004f * rng.normal();
        }
      }
    }
  return gh;
}

void run_choice_case(const ChoiceCase& c) {
  SCOPED_TRACE(c.name);
  const int B = int(c.lens.size()), S = c.S, M = c.MG * S;
  SelectConfig sel;
  sel.budget_tokens = c.budget;
  sel.sink_pages = c.sink;
  sel.recent_pages = c.recent;
  TwoLevelConfig two;
  two.first_groups = c.first_groups;
  two.min_groups = 4;  // the cases' small group counts engage level 1 (the default is 32)
  const int L = two_level_list_capacity(two, sel, kP, S, M);
  test::Rng rng(7);
  std::vector<int32_t> table(size_t(B) * M);
  for (auto& x : table) x = rng.integer(0, 1 << 20);
  const std::vector<float> gh = choice_scores(c, 11);
  std::vector<int32_t> lens = c.lens;
  const BatchView hb{table.data(), M, lens.data(), B, M};
  const SuperTableView htv{nullptr, c.MG, c.MG};

  // The reference list (double).
  std::vector<int32_t> cmap(size_t(B) * c.Hkv * L), clen(static_cast<size_t>(B));
  cpu::select_groups_list(gh.data(), htv, hb, c.Hq, c.Hkv, kP, S, sel, two, L, cmap.data(),
                          clen.data());
  std::vector<int32_t> cblk(cmap.size());
  for (size_t i = 0; i < cmap.size(); ++i) {
    const size_t b = i / (size_t(c.Hkv) * L);
    cblk[i] = cmap[i] < 0 ? -1 : table[b * M + size_t(cmap[i])];
  }

  DevBuf<float> dgh(gh);
  DevBuf<int32_t> dtable(table), dlens(lens);
  const BatchView db{dtable.p, M, dlens.p, B, M};
  const SuperTableView dtv{nullptr, c.MG, c.MG};
  int tried = 0;
  for (int cs : {0, 1, 2, 4, 8}) {
    if (cs > 0 && int64_t(cs) * 4096 < c.MG) continue;  // the span cannot hold the row
    SCOPED_TRACE("cluster " + std::to_string(cs));
    DevBuf<int32_t> map(cmap.size()), len(clen.size()), blk(cmap.size());
    map.poison(), len.poison(), blk.poison();
    cuda::select_groups_list(dgh.p, dtv, db, c.Hq, c.Hkv, kP, S, sel, two, L, map.p, len.p, nullptr,
                             blk.p, cs);
    CK(cudaDeviceSynchronize());
    ASSERT_EQ(map.download(), cmap);
    ASSERT_EQ(len.download(), clen);
    ASSERT_EQ(blk.download(), cblk);
    ++tried;
  }
  EXPECT_GE(tried, 2);
}

TEST(CudaGroupChoice, EveryClusterSizeMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const int P = kP;
  // One case a line: name, Hq, Hkv, S, groups, budget, sink, recent, first_groups, ties, lengths.
  // clang-format off
  const std::vector<ChoiceCase> cases = {
      // Llama-3.1-8B at 1M (S 32: 2048 groups), a shorter and a fallback row beside.
      {"G4 S32 2048 groups", 32, 8, 32, 2048, 2048, 1, 4, 1, false,
       {2048 * 32 * P, 700 * 32 * P + 5, 3 * 32 * P}},
      // GLM-4-9B (G 16), budget 512: the kept groups few against the row.
      {"G16 S32 2048 groups", 32, 2, 32, 2048, 512, 0, 0, 1, false, {2048 * 32 * P - 7}},
      // Qwen-like G 7, a row that is not a multiple of the 256-group slice.
      {"G7 S16 4196 groups", 28, 4, 16, 4196, 1024, 2, 3, 2, false,
       {4196 * 16 * P, 4100 * 16 * P + 100, 1000 * 16 * P}},
      // One KV head of 32 query heads, 8192 groups: at least two blocks a row.
      {"G32 S16 8192 groups", 32, 1, 16, 8192, 4096, 1, 1, 1, false, {8192 * 16 * P - 1}},
      // Ties everywhere (37 values): the threshold's ties split across block spans.
      {"G1 ties", 8, 8, 16, 3000, 2048, 0, 2, 0, true, {3000 * 16 * P, 2999 * 16 * P + 3}},
      {"G4 ties", 16, 4, 32, 2600, 512, 1, 0, 1, true, {2600 * 32 * P}},
      // The most groups a row (8 blocks of 4096), also with the widest group (the most
      // shared memory: 32 KB of slice partials).
      {"G4 32768 groups", 4, 1, 2, 32768, 8192, 1, 8, 1, false, {32768 * 2 * P}},
      {"G32 32768 groups", 32, 1, 2, 32768, 2048, 0, 0, 1, false, {32768 * 2 * P - 3}},
  };
  // clang-format on
  for (const ChoiceCase& c : cases) run_choice_case(c);
}

// Rows the CPU reference refuses (lengths outside [1, M P]) list nothing on the GPU, whatever
// the cluster size, and the other rows keep their lists.
TEST(CudaGroupChoice, InvalidLengthsListNothing) {
  SKIP_WITHOUT_GPU();
  const int Hq = 8, Hkv = 2, S = 16, MG = 5000, M = MG * S, B = 3;
  SelectConfig sel;
  sel.budget_tokens = 1024;
  TwoLevelConfig two;
  const int L = two_level_list_capacity(two, sel, kP, S, M);
  ChoiceCase c{"", Hq, Hkv, S, MG, 1024, 0, 0, 1, false, {M * kP, 0, M * kP}};
  const std::vector<float> gh = choice_scores(c, 3);
  std::vector<int32_t> table(size_t(B) * M, 1), lens = {M * kP, 0, M * kP + 1};
  DevBuf<float> dgh(gh);
  DevBuf<int32_t> dtable(table), dlens(lens);
  const BatchView db{dtable.p, M, dlens.p, B, M};
  const SuperTableView dtv{nullptr, MG, MG};
  for (int cs : {2, 4, 8}) {
    DevBuf<int32_t> map(size_t(B) * Hkv * L), len(static_cast<size_t>(B)), blk(size_t(B) * Hkv * L);
    map.poison(), len.poison(), blk.poison();
    cuda::select_groups_list(dgh.p, dtv, db, Hq, Hkv, kP, S, sel, two, L, map.p, len.p, nullptr,
                             blk.p, cs);
    CK(cudaDeviceSynchronize());
    const auto m = map.download(), l = len.download(), k = blk.download();
    EXPECT_EQ(l[1], 0);
    EXPECT_EQ(l[2], 0);
    EXPECT_GT(l[0], 0);
    for (int b = 1; b < B; ++b)
      for (size_t i = size_t(b) * Hkv * L; i < size_t(b + 1) * Hkv * L; ++i) {
        ASSERT_EQ(m[i], -1) << "b " << b;
        ASSERT_EQ(k[i], -1) << "b " << b;
      }
  }
}

TEST(CudaGroupChoice, RefusesClusterThatCannotHoldTheRow) {
  SKIP_WITHOUT_GPU();
  const int Hq = 4, Hkv = 1, S = 16, MG = 9000, M = MG * S;
  SelectConfig sel;
  sel.budget_tokens = 1024;
  TwoLevelConfig two;
  const int L = two_level_list_capacity(two, sel, kP, S, M);
  DevBuf<float> dgh(static_cast<size_t>(Hq) * MG);
  DevBuf<int32_t> dtable(static_cast<size_t>(M)), dlens(1), map(static_cast<size_t>(L)), len(1);
  const BatchView db{dtable.p, M, dlens.p, 1, M};
  const SuperTableView dtv{nullptr, MG, MG};
  for (int cs : {1, 2, 3, 16})  // 9000 groups need 4 blocks of 4096; 3 and 16 are not sizes
    EXPECT_THROW(cuda::select_groups_list(dgh.p, dtv, db, Hq, Hkv, kP, S, sel, two, L, map.p, len.p,
                                          nullptr, nullptr, cs),
                 InvalidArgument)
        << cs;
  const BatchView no_table{nullptr, M, dlens.p, 1, M};
  EXPECT_THROW(cuda::select_groups_list(dgh.p, dtv, no_table, Hq, Hkv, kP, S, sel, two, L, map.p,
                                        len.p, nullptr, map.p, 4),
               InvalidArgument);  // block ids asked for without a block table
}

// The plan's cluster rule (DecodeParams::group_cluster 0): the fewest blocks that hold the row,
// doubled up to 8 while rows x blocks stay within half a wave and each block keeps 2 slices.
TEST(CudaGroupChoice, PlanRule) {
  SKIP_WITHOUT_GPU();
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  auto plan = [](int B, int Hq, int Hkv, int M, int S, int forced) {
    DecodeParams p;
    p.cache = CacheLayout{1, kP, Hkv, 128, DType::bf16};
    p.summary = summary_layout_for(p.cache, 8, Precision::quant);
    p.num_q_heads = Hq;
    p.max_batch = B;
    p.max_blocks_per_seq = M;
    p.select.budget_tokens = 2048;
    p.two_level = true;
    p.super = SuperLayout{1, S, kP, Hkv, 128, 8, true};
    p.group_cluster = forced;
    return cuda::plan_decode(p);
  };
  auto expect = [&](int64_t rows, int groups) {  // the rule, restated
    int cs = 1;
    while (cs * 4096 < groups) cs *= 2;
    while (cs < 8 && rows * cs * 2 <= sms && (groups + 255) / 256 >= cs * 4) cs *= 2;
    return cs;
  };
  const DecodePlan llama_1m = plan(1, 32, 8, 65536, 32, 0);  // 2048 groups, 8 rows
  EXPECT_EQ(llama_1m.group_cluster, expect(8, 2048));
  if (sms >= 128) EXPECT_EQ(llama_1m.group_cluster, 4);  // the H200: 8 rows x 4 blocks
  EXPECT_EQ(plan(8, 32, 8, 8192, 32, 0).group_cluster, expect(64, 256));       // 128K batch 8: 1
  EXPECT_EQ(plan(1, 32, 1, 8192 * 16, 16, 0).group_cluster, expect(1, 8192));  // >= 2
  EXPECT_GE(plan(1, 32, 1, 8192 * 16, 16, 0).group_cluster, 2);
  EXPECT_EQ(plan(1, 32, 8, 65536, 32, 2).group_cluster, 2);         // forced
  EXPECT_THROW(plan(1, 32, 1, 8192 * 16, 16, 1), InvalidArgument);  // 1 block cannot hold it
  EXPECT_THROW(plan(1, 32, 8, 65536, 32, 3), InvalidArgument);      // not a power of two
  // The plan vector carries the choice.
  const DecodePlan back = DecodePlan::from_ints(llama_1m.to_ints());
  EXPECT_EQ(back.group_cluster, llama_1m.group_cluster);
}

}  // namespace
}  // namespace locks
