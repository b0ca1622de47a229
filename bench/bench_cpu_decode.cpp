// CPU decode step: LOCKS (cpu::Decoder: score from summaries, GQA aggregate, select,
// sparse attention) against dense attention over every key, on the same bf16 paged cache.
// 8 KV heads x 4 query heads each, head_dim 128, P 16, r 8, budget 2048, batch 1, at 32K
// and 128K tokens; int4 (shipped) and fp32 summaries.
//
// Each iteration runs one LOCKS step and one dense step back to back and times each
// (manual time = the LOCKS step), so the two are measured under the same machine load.
// Counters: locks_ms, dense_ms, time_ratio = dense / LOCKS (wall); the same in process CPU
// time (locks_cpu_ms, dense_cpu_ms, cpu_time_ratio); bytes read per step
// (K/V at bf16 as stored; summaries as stored), bytes_ratio = dense / LOCKS.
// BM_StepStages splits the LOCKS step into its four stages (32K only).
// BM_TwoLevelStep: the two-level step (cpu::decode_two_level: super summaries first, page
// summaries of the kept groups only; S 32, R 8, alpha 40) beside the flat step and dense, one
// plan, at 256K tokens, b 512, int4 summaries; its counters as BM_DecodeStep's plus flat_ms and
// the byte model's ratios (two_level_step_bytes). Its third argument is flat_below_groups: 8
// (the default) or above the row's 512 groups, where the step scores every page inside the
// two-level op (what that fallback costs against the flat step beside it).
// Data: i.i.d. Gaussian K, V, q (the step's cost does not depend on the values).
#include <benchmark/benchmark.h>
#include <time.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "locks/attention.h"
#include "locks/contract.h"
#include "locks/decoder.h"
#include "locks/kv_cache.h"
#include "locks/score.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "locks/super_summary.h"

namespace {

constexpr int kKvHeads = 8, kGroup = 4, kQHeads = kKvHeads * kGroup, kHeadDim = 128;
constexpr int kPageSize = 16, kRank = 8, kBudget = 2048;

struct Setup {
  int64_t tokens;
  std::unique_ptr<locks::PagedKvCache> cache;
  locks::PagedKvCache::Batch batch;
  std::unique_ptr<locks::SummaryStore> fp32, quant;
  std::vector<float> q;

  explicit Setup(int64_t t) : tokens(t) {
    locks::CacheLayout l;
    l.num_blocks = t / kPageSize;
    l.page_size = kPageSize;
    l.num_kv_heads = kKvHeads;
    l.head_dim = kHeadDim;
    l.dtype = locks::DType::bf16;
    cache = std::make_unique<locks::PagedKvCache>(l);
    const int seq = cache->add_sequence();
    std::mt19937 g(1);
    std::normal_distribution<float> nd;  // benchmark data: portability irrelevant
    const int64_t chunk = 4096;
    std::vector<float> k(chunk * kKvHeads * kHeadDim), v(k.size());
    for (int64_t done = 0; done < t; done += chunk) {
      for (float& x : k) x = nd(g);
      for (float& x : v) x = nd(g);
      cache->append(seq, k.data(), v.data(), std::min(chunk, t - done));
    }
    batch = cache->batch({seq});
    q.resize(kQHeads * kHeadDim);
    for (float& x : q) x = nd(g);

    // fp32 summaries by SVD; int4 ones by quantizing them (what summary_build does in
    // quant mode, without a second SVD pass).
    fp32 = std::make_unique<locks::SummaryStore>(
        locks::summary_layout_for(l, kRank, locks::Precision::fp32));
    quant = std::make_unique<locks::SummaryStore>(
        locks::summary_layout_for(l, kRank, locks::Precision::quant));
    const std::vector<int32_t>& blocks = cache->blocks(seq);
    std::fprintf(stderr, "building summaries for %lld tokens...\n", static_cast<long long>(t));
    locks::cpu::summary_build(cache->view(), blocks.data(), static_cast<int64_t>(blocks.size()),
                              fp32->view());
    const locks::SummaryView f = fp32->view(), s = quant->view();
    const int d = kHeadDim, r = kRank, P = kPageSize;
    for (int64_t bh = 0; bh < l.num_blocks * kKvHeads; ++bh)
      locks::summary_quantize(f.mu + bh * d, f.basis + bh * r * d, f.coeff + bh * P * r, d, P, r,
                              s.layout.basis_group, s.mu_q + bh * d, s.mu_scale + bh,
                              s.basis_q + bh * r * (d / 2),
                              s.basis_scale + bh * locks::basis_scales_per_head(s.layout),
                              s.coeff_q + bh * P * r, s.coeff_scale + bh * r);
  }
};

// CPU time of the whole process (all threads), seconds. With OMP_NUM_THREADS=1 it is the
// step's compute time without the time spent descheduled on a shared machine.
double process_cpu_s() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

Setup& setup_for(int64_t tokens) {
  static std::unique_ptr<Setup> current;  // one at a time: the 128K cache alone is 512 MB
  if (!current || current->tokens != tokens) {
    current.reset();
    current = std::make_unique<Setup>(tokens);
  }
  return *current;
}

void BM_DecodeStep(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const bool quant = state.range(1) != 0;
  Setup& s = setup_for(tokens);
  const locks::CacheLayout& l = s.cache->layout();
  locks::DecodeConfig cfg;
  cfg.select.budget_tokens = kBudget;
  locks::cpu::Decoder decoder(l, kQHeads, 1, s.batch.view.max_blocks_per_seq, cfg);
  locks::SummaryStore& store = quant ? *s.quant : *s.fp32;
  const locks::SummaryView sv = store.view();
  const locks::QueryView qv{s.q.data(), kQHeads};
  std::vector<float> out(kQHeads * kHeadDim);
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  double locks_s = 0, dense_s = 0, locks_cpu = 0, dense_cpu = 0;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const double c0 = process_cpu_s();
    const auto t0 = clock::now();
    decoder.run(s.cache->view(), sv, s.batch.view, qv, {out.data(), nullptr});
    const auto t1 = clock::now();
    const double c1 = process_cpu_s();
    locks::cpu::decode_attention_dense(s.cache->view(), s.batch.view, qv, scale,
                                       {out.data(), nullptr});
    const auto t2 = clock::now();
    dense_cpu += process_cpu_s() - c1;
    locks_cpu += c1 - c0;
    benchmark::DoNotOptimize(out.data());
    const double a = std::chrono::duration<double>(t1 - t0).count();
    locks_s += a;
    dense_s += std::chrono::duration<double>(t2 - t1).count();
    state.SetIterationTime(a);
  }
  const double n = double(state.iterations());
  const locks::Selection sel = decoder.selection();
  double attended = 0;  // tokens over all KV heads (no tail page here: tokens % P == 0)
  for (int h = 0; h < kKvHeads; ++h) attended += double(sel.counts[h]) * kPageSize;
  const double kv_bytes_per_token_head = 2.0 * 2.0 * kHeadDim;  // K and V, bf16
  const double summary_bytes =
      double(locks::summary_bytes_per_page(store.layout())) * double(l.num_blocks) * kKvHeads;
  const double locks_bytes = summary_bytes + attended * kv_bytes_per_token_head;
  const double dense_bytes = double(tokens) * kKvHeads * kv_bytes_per_token_head;
  state.counters["locks_ms"] = 1e3 * locks_s / n;
  state.counters["dense_ms"] = 1e3 * dense_s / n;
  state.counters["time_ratio"] = dense_s / locks_s;
  state.counters["locks_cpu_ms"] = 1e3 * locks_cpu / n;
  state.counters["dense_cpu_ms"] = 1e3 * dense_cpu / n;
  state.counters["cpu_time_ratio"] = dense_cpu / locks_cpu;
  state.counters["locks_MB"] = locks_bytes / 1e6;
  state.counters["summary_MB"] = summary_bytes / 1e6;
  state.counters["dense_MB"] = dense_bytes / 1e6;
  state.counters["bytes_ratio"] = dense_bytes / locks_bytes;
  state.counters["locks_GBps"] = locks_bytes / (locks_s / n) / 1e9;
  state.counters["dense_GBps"] = dense_bytes / (dense_s / n) / 1e9;
  state.SetLabel(quant ? "int4 summaries" : "fp32 summaries");
}

// Where a LOCKS step's time goes: the four stages cpu::Decoder::run chains, timed apart
// (counters in ms per step), on the same cache and summaries.
void BM_StepStages(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const bool quant = state.range(1) != 0;
  Setup& s = setup_for(tokens);
  locks::SummaryStore& store = quant ? *s.quant : *s.fp32;
  const locks::SummaryView sv = store.view();
  const locks::QueryView qv{s.q.data(), kQHeads};
  const int M = s.batch.view.max_blocks_per_seq;
  const float scale = 1.0f / std::sqrt(float(kHeadDim));
  locks::SelectConfig cfg;
  cfg.budget_tokens = kBudget;
  const int cap = locks::select_capacity(cfg, kPageSize, M);
  std::vector<float> head(size_t(kQHeads) * M), group(size_t(kKvHeads) * M),
      out(kQHeads * kHeadDim);
  std::vector<int32_t> pages(size_t(kKvHeads) * cap), counts(kKvHeads);
  const locks::Selection sel{pages.data(), counts.data(), cap};
  double t[4] = {0, 0, 0, 0};
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = clock::now();
    locks::cpu::score_pages(sv, s.batch.view, qv, scale, head.data());
    const auto t1 = clock::now();
    locks::cpu::aggregate_gqa(head.data(), s.batch.view, kQHeads, kKvHeads, group.data());
    const auto t2 = clock::now();
    locks::cpu::select_pages(group.data(), s.batch.view, kKvHeads, kPageSize, cfg, sel);
    const auto t3 = clock::now();
    locks::cpu::decode_attention_sparse(s.cache->view(), s.batch.view, qv, scale, sel,
                                        {out.data(), nullptr});
    const auto t4 = clock::now();
    benchmark::DoNotOptimize(out.data());
    const clock::time_point ts[5] = {t0, t1, t2, t3, t4};
    for (int i = 0; i < 4; ++i) t[i] += std::chrono::duration<double>(ts[i + 1] - ts[i]).count();
    state.SetIterationTime(std::chrono::duration<double>(t4 - t0).count());
  }
  const double n = double(state.iterations());
  state.counters["score_ms"] = 1e3 * t[0] / n;
  state.counters["aggregate_ms"] = 1e3 * t[1] / n;
  state.counters["select_ms"] = 1e3 * t[2] / n;
  state.counters["sparse_attn_ms"] = 1e3 * t[3] / n;
  state.SetLabel(quant ? "int4 summaries" : "fp32 summaries");
}

// Args: {tokens, quant}. Fixed iteration counts: each iteration also runs the dense step,
// which the manual time (LOCKS only) does not see, so an automatic count would run long.
BENCHMARK(BM_DecodeStep)
    ->Args({32768, 1})
    ->Args({32768, 0})
    ->Iterations(20)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DecodeStep)
    ->Args({131072, 1})
    ->Args({131072, 0})
    ->Iterations(8)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// The two-level step against the flat one and dense on the same cache (one plan: the flat and
// dense ops run from a two-level plan too), super summaries of every complete group.
void BM_TwoLevelStep(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const int budget = int(state.range(1));
  const int flat_below = int(state.range(2));
  Setup& s = setup_for(tokens);
  const locks::CacheLayout& l = s.cache->layout();
  const int M = s.batch.view.max_blocks_per_seq, S = 32;
  static std::unique_ptr<locks::SuperStore> supers;  // built once per cache
  static int64_t supers_for = 0;
  const int groups = M / S;
  std::vector<int32_t> table(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) table[size_t(g)] = g;
  locks::SuperLayout U;
  U.num_slots = groups;
  U.group_pages = S;
  U.page_size = kPageSize;
  U.num_kv_heads = kKvHeads;
  U.head_dim = kHeadDim;
  U.rank = 8;
  if (!supers || supers_for != tokens) {
    std::fprintf(stderr, "building super summaries for %lld tokens...\n", (long long)tokens);
    supers = std::make_unique<locks::SuperStore>(U);
    const std::vector<int32_t>& blocks = s.cache->blocks(0);
    std::vector<int32_t> gb(blocks.begin(), blocks.begin() + int64_t(groups) * S);
    locks::cpu::super_build(s.cache->view(), gb.data(), table.data(), groups, supers->view());
    supers_for = tokens;
  }
  locks::DecodeParams p;
  p.cache = l;
  p.summary = s.quant->layout();
  p.num_q_heads = kQHeads;
  p.max_batch = 1;
  p.max_blocks_per_seq = M;
  p.select.budget_tokens = budget;
  p.two_level = true;
  p.two.flat_below_groups = flat_below;
  p.super = U;
  const locks::DecodePlan plan = locks::cpu::plan_decode(p);
  std::vector<std::byte> wsb(plan.workspace_bytes + 256);
  void* base = wsb.data();
  size_t room = wsb.size();
  void* aligned = std::align(256, plan.workspace_bytes, base, room);
  const locks::Workspace ws{aligned, plan.workspace_bytes};
  const locks::SuperTableView tv{table.data(), groups, groups};
  const locks::QueryView qv{s.q.data(), kQHeads};
  std::vector<float> out(kQHeads * kHeadDim);
  const locks::AttentionOutput ao{out.data(), nullptr};
  double two_s = 0, flat_s = 0, dense_s = 0;
  using clock = std::chrono::steady_clock;
  for (auto _ : state) {
    const auto t0 = clock::now();
    locks::cpu::decode_two_level(plan, ws, s.cache->view(), s.quant->view(), supers->view(), tv,
                                 s.batch.view, qv, ao, nullptr);
    const auto t1 = clock::now();
    locks::cpu::decode(plan, ws, s.cache->view(), s.quant->view(), s.batch.view, qv, ao, nullptr);
    const auto t2 = clock::now();
    locks::cpu::decode_attention_dense(plan, ws, s.cache->view(), s.batch.view, qv, ao);
    const auto t3 = clock::now();
    benchmark::DoNotOptimize(out.data());
    const double a = std::chrono::duration<double>(t1 - t0).count();
    two_s += a;
    flat_s += std::chrono::duration<double>(t2 - t1).count();
    dense_s += std::chrono::duration<double>(t3 - t2).count();
    state.SetIterationTime(a);
  }
  const double n = double(state.iterations());
  const locks::StepBytes b =
      locks::two_level_step_bytes(U, s.quant->layout(), p.two, p.select, tokens);
  state.counters["two_ms"] = 1e3 * two_s / n;
  state.counters["flat_ms"] = 1e3 * flat_s / n;
  state.counters["dense_ms"] = 1e3 * dense_s / n;
  state.counters["dense_over_two"] = dense_s / two_s;
  state.counters["dense_over_flat"] = dense_s / flat_s;
  state.counters["bytes_dense_over_two"] = b.dense / b.total();
  state.counters["bytes_dense_over_flat"] = b.dense / b.flat;
  state.SetLabel(flat_below > groups ? "int4 summaries, S 32, alpha 40, flat below " +
                                           std::to_string(flat_below) + " groups (fallback)"
                                     : "int4 summaries, S 32, alpha 40");
}

}  // namespace

BENCHMARK(BM_StepStages)
    ->Args({32768, 1})
    ->Args({32768, 0})
    ->Iterations(10)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// Args: {tokens, budget, flat_below_groups}.
BENCHMARK(BM_TwoLevelStep)
    ->Args({262144, 512, 8})
    ->Args({262144, 512, 1024})
    ->Iterations(5)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
