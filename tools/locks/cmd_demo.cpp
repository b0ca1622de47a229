// `locks demo`: the seed's configuration (65,536 tokens, head_dim 128, P 16, r 8, b 2048,
// one query, one head) on i.i.d. Gaussian data (what the seed's code draws) and on
// structured data (page-local low-rank keys, attention peaked on a few pages), with fp32
// and int4 summaries. Every number printed is computed or measured by this run.
#include <omp.h>

#include <cstdio>
#include <iostream>

#include "command.h"
#include "locks/summary.h"
#include "locks/synthetic.h"
#include "single_sequence.h"

namespace {

constexpr int64_t kTokens = 65536;
constexpr int kHeadDim = 128, kPageSize = 16, kRank = 8, kBudget = 2048, kTimingReps = 7;

constexpr const char* kUsage =
    "usage: locks demo\n"
    "The seed configuration (65,536 tokens, head_dim 128, page 16, rank 8, budget 2,048\n"
    "tokens, one query, one head) on (a) i.i.d. Gaussian K, V, q as in the seed's code and\n"
    "(b) structured data (synthetic kind local_lowrank, docs/synthetic.md), with fp32 and\n"
    "int4 summaries. Prints attended share, attention-mass recall, cosine to FullKV, bytes\n"
    "read per step against FullKV, and measured time per step against dense attention.\n";

std::string mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  return buf;
}

void run_dataset(const char* title, locks::SynthKind kind) {
  locks::SynthConfig c;
  c.kind = kind;
  c.tokens = kTokens;
  c.head_dim = kHeadDim;
  c.page_size = kPageSize;
  const locks::SynthData data = locks::synth_generate(c);
  const locks::cli::SingleSequence seq(data.keys.data(), data.values.data(), kTokens, 1, kHeadDim,
                                       kPageSize);
  locks::SelectConfig sel;
  sel.budget_tokens = kBudget;

  std::printf("\n(%s) %s\n", title, locks::synth_name(kind));
  std::printf("  %-8s %9s %8s %9s  %-36s  %s\n", "summary", "attended", "recall", "cosine",
              "bytes read/step: LOCKS vs FullKV", "time/step: LOCKS vs dense");
  for (locks::Precision prec : {locks::Precision::fp32, locks::Precision::quant}) {
    const std::string label = std::string("  building ") + locks::precision_name(prec) +
                              " summaries (" + locks::synth_name(kind) + ")";
    const auto store = seq.build_summaries(kRank, prec, label.c_str());
    const locks::cli::StepResult r = seq.step(*store, data.queries.data(), 1, sel);
    const locks::cli::StepBytes b = seq.bytes(store->layout(), r);
    const auto t = seq.time_steps(*store, data.queries.data(), 1, sel, kTimingReps);
    // Also on one thread: on a busy machine every OpenMP region of a step can wait for a
    // descheduled thread, and the LOCKS step has four regions where dense has one.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const auto t1 = seq.time_steps(*store, data.queries.data(), 1, sel, kTimingReps);
    omp_set_num_threads(threads);
    const std::string bytes = mb(b.locks()) + " vs " + mb(b.full_kv);
    char ratio[24];
    std::snprintf(ratio, sizeof ratio, " (%.2fx fewer)", b.full_kv / b.locks());
    std::printf("  %-8s %8.2f%% %8.4f %9.4f  %-36s  %.2f ms vs %.2f ms (%.2fx)\n",
                locks::precision_name(prec), 100.0 * double(r.attended_tokens[0]) / kTokens,
                r.recall[0], r.cosine[0], (bytes + ratio).c_str(), t.locks_ms, t.dense_ms,
                t.dense_ms / t.locks_ms);
    std::printf(
        "  %-8s %s summaries %s + selected K/V %s; one thread: %.2f ms vs %.2f ms (%.2fx)\n", "",
        locks::precision_name(prec), mb(b.summaries).c_str(), mb(b.selected_kv).c_str(),
        t1.locks_ms, t1.dense_ms, t1.dense_ms / t1.locks_ms);
  }
  if (!data.relevant_pages.empty()) {
    std::printf("  planted relevant pages:");
    for (int64_t j : data.relevant_pages) std::printf(" %lld", static_cast<long long>(j));
    std::printf("\n");
  }
}

int run_demo(const std::vector<std::string>& args) {
  if (!args.empty()) {
    const bool help = args[0] == "--help" || args[0] == "-h";
    (help ? std::cout : std::cerr) << (help ? "" : "locks demo: takes no arguments\n") << kUsage;
    return help ? 0 : 2;
  }
  std::printf(
      "locks demo: %lld tokens, head_dim %d, page %d, rank %d, budget %d tokens (%lld of %lld "
      "pages), 1 KV head, 1 query head; CPU, %d thread(s)\n",
      static_cast<long long>(kTokens), kHeadDim, kPageSize, kRank, kBudget,
      static_cast<long long>(kBudget / kPageSize), static_cast<long long>(kTokens / kPageSize),
      omp_get_max_threads());
  std::printf(
      "attended: share of tokens attended; recall: share of the exact softmax mass on them;\n"
      "cosine: LOCKS output vs FullKV output. Bytes: K/V counted at bf16 (2 bytes/element; this\n"
      "demo's cache holds fp32), summaries as stored. Times: best of %d steps on this fp32\n"
      "cache (LOCKS = score + select + sparse attention; dense = every key), with %d OpenMP\n"
      "thread(s) and with one.\n",
      kTimingReps, omp_get_max_threads());
  std::fflush(stdout);
  run_dataset("a", locks::SynthKind::gaussian);
  std::fflush(stdout);
  run_dataset("b", locks::SynthKind::local_lowrank);
  std::printf(
      "\nGaussian keys have no page-local structure and near-uniform attention, so no page\n"
      "selector can reach FullKV there at a 3%% budget: a low cosine on (a) is expected (the\n"
      "seed's \"0.98+\" does not hold for its own random data). (b) shows the intended regime.\n");
  return 0;
}

}  // namespace

LOCKS_COMMAND(demo, "demo", "the seed configuration on Gaussian and structured data", run_demo);
