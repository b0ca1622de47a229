// `locks select`: one LOCKS decode step on K/V/q given as .npy files: the pages each KV head
// selects, each query head's output and its agreement with FullKV.
#include <cmath>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/capture.h"
#include "locks/kv_cache.h"
#include "locks/npy.h"
#include "locks/select.h"
#include "locks/summary.h"
#include "options.h"
#include "single_sequence.h"

namespace {

constexpr const char* kUsage =
    "usage: locks select --keys K.npy --values V.npy --query q.npy [--budget 2048]\n"
    "                    [--page-size 16] [--rank 8] [--precision fp32|int4]\n"
    "                    [--sink-pages 0] [--recent-pages 0] [--tau 0] [--floor-pages 1]\n"
    "                    [--json]\n"
    "One LOCKS decode step (cpu::Decoder) and the dense FullKV step on the same data.\n"
    "  K, V: [tokens, head_dim] or [tokens, kv_heads, head_dim]; q: [head_dim] or\n"
    "  [q_heads, head_dim] (q_heads a multiple of kv_heads); float32 or float16 .npy.\n"
    "Prints, per KV head, the selected page indices; per query head, the output vector, its\n"
    "cosine to FullKV and the attention-mass recall; and the summaries' size as a share of\n"
    "the bf16 K+V. --json prints the same as one JSON object.\n"
    "Exit status: 0 success, 1 bad data (unreadable .npy, shapes, NaN/Inf, ...), 2 usage.\n";

// A data error (exit 1): locks::Error with the message only (no function name).
template <typename... Parts>
void require(bool ok, const Parts&... parts) {
  if (ok) return;
  std::ostringstream os;
  (os << ... << parts);
  throw locks::Error(os.str());
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

// First non-finite element as "token t, head h, dim i" (or "element i" for q).
void require_finite(const locks::NpyArray& a, const char* what) {
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (std::isfinite(a.data[i])) continue;
    std::ostringstream where;
    int64_t rest = static_cast<int64_t>(i);
    std::vector<int64_t> idx(a.shape.size());
    for (size_t k = a.shape.size(); k-- > 0;) {
      idx[k] = rest % a.shape[k];
      rest /= a.shape[k];
    }
    require(false, what, " contains ", std::isnan(a.data[i]) ? "NaN" : "Inf", " at index ",
            shape_str(idx));
  }
}

struct Problem {
  locks::NpyArray k, v, q;
  int64_t tokens = 0;
  int kv_heads = 1, q_heads = 1, head_dim = 0;
};

Problem load_problem(const std::string& kp, const std::string& vp, const std::string& qp) {
  Problem p;
  p.k = locks::npy_load(kp);
  p.v = locks::npy_load(vp);
  p.q = locks::npy_load(qp);
  const auto &ks = p.k.shape, &vs = p.v.shape, &qs = p.q.shape;
  require(ks.size() == 2 || ks.size() == 3, "K (", kp,
          ") must be [tokens, head_dim] or [tokens, kv_heads, head_dim], got shape ",
          shape_str(ks));
  require(vs == ks, "V shape ", shape_str(vs), " differs from K shape ", shape_str(ks));
  require(qs.size() == 1 || qs.size() == 2, "q (", qp,
          ") must be [head_dim] or [q_heads, head_dim], got shape ", shape_str(qs));
  p.tokens = ks[0];
  p.head_dim = static_cast<int>(ks.back());
  p.kv_heads = ks.size() == 3 ? static_cast<int>(ks[1]) : 1;
  p.q_heads = qs.size() == 2 ? static_cast<int>(qs[0]) : 1;
  require(p.tokens >= 1, "K has 0 tokens: nothing to attend to");
  require(p.kv_heads >= 1, "K has 0 KV heads");
  require(qs.back() == ks.back(), "q head_dim ", qs.back(), " differs from K head_dim ", ks.back(),
          " (q shape ", shape_str(qs), ", K shape ", shape_str(ks), ")");
  require(p.q_heads >= 1 && p.q_heads % p.kv_heads == 0, "q has ", p.q_heads,
          " query heads, not a positive multiple of K's ", p.kv_heads, " KV heads");
  require(ks.back() <= locks::kMaxHeadDim && locks::head_dim_valid(int(ks.back())), "head_dim ",
          ks.back(), " is not supported (supported: even, ", locks::kMinHeadDim, " to ",
          locks::kMaxHeadDim, ")");
  require_finite(p.k, "K");
  require_finite(p.v, "V");
  require_finite(p.q, "q");
  locks::eval::check_logit_range(p.q.data.data(), p.q_heads, p.k.data.data(), p.tokens * p.kv_heads,
                                 p.head_dim, 1.0 / std::sqrt(double(p.head_dim)), "K and q");
  return p;
}

int run_select(const std::vector<std::string>& args) {
  for (const std::string& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    }
  const locks::cli::SelectOptions o = locks::cli::parse_select_options(args);
  const locks::SelectConfig& sel = o.select;
  const int page_size = o.page_size, rank = o.rank;
  const locks::Precision precision = o.precision;
  const std::string& prec_name = o.precision_name;
  const std::string &kp = o.keys, &vp = o.values, &qp = o.query;

  const Problem p = load_problem(kp, vp, qp);
  const locks::cli::SingleSequence seq(p.k.data.data(), p.v.data.data(), p.tokens, p.kv_heads,
                                       p.head_dim, page_size);
  const auto store =
      seq.build_summaries(rank, precision, p.tokens >= 16384 ? "building summaries" : nullptr);
  const locks::cli::StepResult r = seq.step(*store, p.q.data.data(), p.q_heads, sel);
  const double share = locks::summary_share_of_bf16_kv(store->layout());
  const int G = p.q_heads / p.kv_heads, d = p.head_dim;
  const int64_t pages = (p.tokens + page_size - 1) / page_size;

  if (o.json) {
    nlohmann::json j;
    j["tokens"] = p.tokens;
    j["pages"] = pages;
    j["kv_heads"] = p.kv_heads;
    j["q_heads"] = p.q_heads;
    j["head_dim"] = d;
    j["input_dtype"] = {
        {"keys", p.k.source_dtype}, {"values", p.v.source_dtype}, {"query", p.q.source_dtype}};
    j["page_size"] = page_size;
    j["rank"] = rank;
    j["precision"] = prec_name;
    j["budget_tokens"] = sel.budget_tokens;
    j["sink_pages"] = sel.sink_pages;
    j["recent_pages"] = sel.recent_pages;
    j["tau"] = sel.tau;
    j["floor_pages"] = sel.floor_pages;
    j["summary_share_of_bf16_kv"] = share;
    j["summary_bytes_per_page_head"] = locks::summary_bytes_per_page(store->layout());
    for (int h = 0; h < p.kv_heads; ++h)
      j["kv_heads_selection"].push_back(
          {{"kv_head", h}, {"pages", r.pages[h]}, {"attended_tokens", r.attended_tokens[h]}});
    for (int h = 0; h < p.q_heads; ++h) {
      std::vector<float> out(r.out_locks.begin() + int64_t(h) * d,
                             r.out_locks.begin() + int64_t(h + 1) * d);
      j["q_heads_output"].push_back({{"q_head", h},
                                     {"kv_head", h / G},
                                     {"recall", r.recall[h]},
                                     {"cosine_to_full", r.cosine[h]},
                                     {"output", out}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }

  std::cout << "locks select: " << p.tokens << " tokens (" << pages << " pages of " << page_size
            << "), " << p.kv_heads << " KV head(s), " << p.q_heads << " query head(s), head_dim "
            << d << "; K " << p.k.source_dtype << ", V " << p.v.source_dtype << ", q "
            << p.q.source_dtype << "\n"
            << "rank " << rank << ", " << prec_name << " summaries (" << std::fixed
            << std::setprecision(2) << 100.0 * share << "% of the bf16 K+V), budget "
            << sel.budget_tokens << " tokens, sink " << sel.sink_pages << ", recent "
            << sel.recent_pages << "\n";
  for (int h = 0; h < p.kv_heads; ++h) {
    std::cout << "kv_head " << h << ": " << r.pages[h].size() << " pages (" << r.attended_tokens[h]
              << " tokens):";
    for (int32_t j : r.pages[h]) std::cout << ' ' << j;
    std::cout << "\n";
  }
  for (int h = 0; h < p.q_heads; ++h) {
    std::cout << "q_head " << h << " (kv_head " << h / G << "): recall " << std::setprecision(6)
              << r.recall[h] << ", cosine to FullKV " << r.cosine[h] << "\n  output:";
    std::cout << std::defaultfloat << std::setprecision(7);
    for (int i = 0; i < d; ++i) std::cout << ' ' << r.out_locks[size_t(h) * d + i];
    std::cout << std::fixed << "\n";
  }
  return 0;
}

}  // namespace

LOCKS_COMMAND(select, "select",
              "one LOCKS decode step on K/V/q .npy files (pages, outputs, recall)", run_select);
