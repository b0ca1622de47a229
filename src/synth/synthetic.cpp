// Synthetic KV generators (see include/locks/synthetic.h and docs/synthetic.md).
// Randomness: std::mt19937_64 (its output sequence is fixed by the standard) fed through
// our own Box-Muller transform, because std::normal_distribution's algorithm differs
// between standard libraries and would make the data depend on the toolchain.
#include "locks/synthetic.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "locks/error.h"

namespace locks {

namespace {

// Scales of the structured generators, in units where bulk keys have O(1) entries and a
// query is q = sqrt(d) * u_h + kQueryNoise * N(0, I): the logit q.k / sqrt(d) of key k is
// then about u_h.k, so "a key with u_h.k = 9" means "a key with logit about 9".
constexpr double kQueryNoise = 0.5;
constexpr double kNoise = 0.1;           // isotropic key noise (local_lowrank)
constexpr double kCentroidStd = 1.0;     // local_lowrank page centroids, per dim
constexpr double kDevStd = 2.0;          // in-page deviations along each basis direction
constexpr double kRelevantShift = 9.0;   // u_h . mu_j of a relevant page
constexpr double kRelevantDevStd = 1.5;  // in-page spread along u_h of a relevant page
constexpr int kMinPageRank = 4, kMaxPageRank = 6;
constexpr double kBlindDominantStd = 2.0;  // blind_spot: std along each dominant direction
constexpr double kBlindNoise = 0.3;        // blind_spot: isotropic noise
constexpr double kNeedleLogit = 13.0;      // needles: u_h . k of a needle key
constexpr int64_t kRelevantPer64K = 4;     // relevant pages (or needles) per 65,536 tokens

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream) {
    uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
    eng_.seed(splitmix64(s));
  }
  // Uniform in (0, 1].
  double uniform() { return (double((eng_() >> 11)) + 1.0) * 0x1.0p-53; }
  // Standard normal, Box-Muller (both outputs used).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    const double t = 2.0 * 3.14159265358979323846 * uniform();
    spare_ = r * std::sin(t);
    has_spare_ = true;
    return r * std::cos(t);
  }
  // Uniform integer in [0, n); the modulo bias is < n / 2^64, irrelevant here.
  int64_t below(int64_t n) { return static_cast<int64_t>(eng_() % static_cast<uint64_t>(n)); }

 private:
  std::mt19937_64 eng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

using Rows = std::vector<double>;  // row-major set of d-vectors

double dot(const double* a, const double* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

// Appends v to `rows` after orthogonalising it (twice, for stability) against every row
// already there; returns false when v was (numerically) in their span.
bool append_orthonormal(Rows& rows, std::vector<double> v, int d) {
  const size_t n = rows.size() / d;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t r = 0; r < n; ++r) {
      const double c = dot(&rows[r * d], v.data(), d);
      for (int i = 0; i < d; ++i) v[i] -= c * rows[r * d + i];
    }
  const double norm = std::sqrt(dot(v.data(), v.data(), d));
  if (norm < 1e-8) return false;
  for (double& x : v) rows.push_back(x / norm);
  return true;
}

std::vector<double> gaussian_vec(Rng& rng, int d, double std) {
  std::vector<double> v(d);
  for (double& x : v) x = std * rng.normal();
  return v;
}

// `count` random orthonormal directions orthogonal to `fixed` (returned without `fixed`).
Rows random_orthonormal(Rng& rng, const Rows& fixed, int count, int d) {
  Rows all = fixed;
  const size_t start = all.size();
  while ((all.size() - start) / d < static_cast<size_t>(count))
    append_orthonormal(all, gaussian_vec(rng, d, 1.0), d);
  return Rows(all.begin() + start, all.end());
}

// Random directions inside span(W) (W orthonormal rows): combinations W^T a, orthonormalised.
Rows random_in_span(Rng& rng, const Rows& W, int count, int d) {
  const int R = static_cast<int>(W.size() / d);
  Rows out;
  while (out.size() / d < static_cast<size_t>(count)) {
    std::vector<double> v(d, 0.0);
    for (int k = 0; k < R; ++k) {
      const double a = rng.normal();
      for (int i = 0; i < d; ++i) v[i] += a * W[k * d + i];
    }
    append_orthonormal(out, v, d);
  }
  return out;
}

std::vector<double> unit_vec(Rng& rng, int d) { return random_orthonormal(rng, {}, 1, d); }

void validate(const SynthConfig& c) {
  LOCKS_REQUIRE(c.tokens >= 1, "tokens must be >= 1, got ", c.tokens);
  LOCKS_REQUIRE(c.num_kv_heads >= 1, "num_kv_heads must be >= 1, got ", c.num_kv_heads);
  LOCKS_REQUIRE(c.num_q_heads >= 1 && c.num_q_heads % c.num_kv_heads == 0,
                "num_q_heads must be a positive multiple of num_kv_heads (", c.num_kv_heads,
                "), got ", c.num_q_heads);
  LOCKS_REQUIRE(c.head_dim >= 16 && c.head_dim % 2 == 0, "head_dim must be even and >= 16, got ",
                c.head_dim);
  LOCKS_REQUIRE(c.page_size >= 2, "page_size must be >= 2, got ", c.page_size);
  LOCKS_REQUIRE(c.steps >= 1, "steps must be >= 1, got ", c.steps);
  LOCKS_REQUIRE(c.tokens <= (int64_t(1) << 31) / (int64_t(c.num_kv_heads) * c.head_dim),
                "tokens * num_kv_heads * head_dim must be <= 2^31 (got ", c.tokens, " x ",
                c.num_kv_heads, " x ", c.head_dim, ")");
  if (c.kind != SynthKind::gaussian)
    LOCKS_REQUIRE(c.tokens >= c.page_size, "kind ", synth_name(c.kind),
                  " plants relevant pages and needs at least one full page: tokens (", c.tokens,
                  ") < page_size (", c.page_size, ")");
}

// Distinct relevant full pages, ascending; avoids the first and last full page when there
// are at least three, so that sink/recent pages do not find them by position.
std::vector<int64_t> pick_relevant(Rng& rng, const SynthConfig& c) {
  const int64_t full = c.tokens / c.page_size;
  const int64_t lo = full >= 3 ? 1 : 0, hi = full >= 3 ? full - 1 : full;  // [lo, hi)
  std::vector<int64_t> cand;
  for (int64_t j = lo; j < hi; ++j) cand.push_back(j);
  const int64_t want = (kRelevantPer64K * c.tokens + 32768) / 65536;
  const int64_t n = std::clamp<int64_t>(want, 1, static_cast<int64_t>(cand.size()));
  for (int64_t i = 0; i < n; ++i) std::swap(cand[i], cand[i + rng.below(cand.size() - i)]);
  cand.resize(n);
  std::sort(cand.begin(), cand.end());
  return cand;
}

void fill_gaussian(std::vector<float>& out, Rng& rng) {
  for (float& x : out) x = static_cast<float>(rng.normal());
}

// Queries aligned with one direction per KV head: q = sqrt(d) u_h + kQueryNoise N(0, I).
void fill_queries(SynthData& s, const std::vector<Rows>& u, Rng& rng) {
  const SynthConfig& c = s.cfg;
  const int d = c.head_dim, G = c.num_q_heads / c.num_kv_heads;
  for (int t = 0; t < c.steps; ++t)
    for (int hq = 0; hq < c.num_q_heads; ++hq) {
      float* q = &s.queries[(int64_t(t) * c.num_q_heads + hq) * d];
      const Rows& uh = u[hq / G];
      for (int i = 0; i < d; ++i)
        q[i] = static_cast<float>(std::sqrt(double(d)) * uh[i] + kQueryNoise * rng.normal());
    }
}

// Writes the keys of tokens [t0, t1) of head h: mu + sum_k z_k basis_k + noise.
void write_page_keys(SynthData& s, int h, int64_t t0, int64_t t1, const std::vector<double>& mu,
                     const Rows& basis, const std::vector<double>& dev_std, double noise,
                     Rng& rng) {
  const SynthConfig& c = s.cfg;
  const int d = c.head_dim, r = static_cast<int>(basis.size() / d);
  std::vector<double> k(d);
  for (int64_t t = t0; t < t1; ++t) {
    k = mu;
    for (int j = 0; j < r; ++j) {
      const double z = dev_std[j] * rng.normal();
      for (int i = 0; i < d; ++i) k[i] += z * basis[j * d + i];
    }
    float* dst = &s.keys[(t * c.num_kv_heads + h) * d];
    for (int i = 0; i < d; ++i) dst[i] = static_cast<float>(k[i] + noise * rng.normal());
  }
}

void set_component(std::vector<double>& v, const Rows& u, double value) {
  const double c = dot(v.data(), u.data(), static_cast<int>(v.size()));
  for (size_t i = 0; i < v.size(); ++i) v[i] += (value - c) * u[i];
}

void gen_local_lowrank(SynthData& s, Rng& rng, const std::vector<Rows>& u) {
  const SynthConfig& c = s.cfg;
  const int d = c.head_dim;
  const int64_t pages = (c.tokens + c.page_size - 1) / c.page_size;
  for (int h = 0; h < c.num_kv_heads; ++h) {
    size_t rel = 0;
    for (int64_t j = 0; j < pages; ++j) {
      const bool relevant = rel < s.relevant_pages.size() && s.relevant_pages[rel] == j;
      if (relevant) ++rel;
      const int r = kMinPageRank + static_cast<int>(rng.below(kMaxPageRank - kMinPageRank + 1));
      std::vector<double> mu = gaussian_vec(rng, d, kCentroidStd);
      Rows basis;
      std::vector<double> dev_std(r, kDevStd);
      if (relevant) {
        // Centroid and first in-page direction aligned with the group's queries.
        set_component(mu, u[h], kRelevantShift);
        basis = u[h];
        const Rows rest = random_orthonormal(rng, basis, r - 1, d);
        basis.insert(basis.end(), rest.begin(), rest.end());
        dev_std[0] = kRelevantDevStd;
      } else {
        basis = random_orthonormal(rng, {}, r, d);
      }
      write_page_keys(s, h, j * c.page_size, std::min(c.tokens, (j + 1) * c.page_size), mu, basis,
                      dev_std, kNoise, rng);
    }
  }
}

void gen_blind_spot(SynthData& s, Rng& rng, std::vector<Rows>& u) {
  const SynthConfig& c = s.cfg;
  const int d = c.head_dim, R = d / 2;
  const int64_t pages = (c.tokens + c.page_size - 1) / c.page_size;
  for (int h = 0; h < c.num_kv_heads; ++h) {
    const Rows W = random_orthonormal(rng, {}, R, d);  // the dominant global subspace
    u[h] = random_orthonormal(rng, W, 1, d);           // query direction, orthogonal to W
    Rows W_and_u = W;
    W_and_u.insert(W_and_u.end(), u[h].begin(), u[h].end());
    size_t rel = 0;
    for (int64_t j = 0; j < pages; ++j) {
      const bool relevant = rel < s.relevant_pages.size() && s.relevant_pages[rel] == j;
      if (relevant) ++rel;
      const int r = kMinPageRank + static_cast<int>(rng.below(kMaxPageRank - kMinPageRank + 1));
      // Every centroid lies in W (large variance along each dominant direction).
      std::vector<double> mu(d, 0.0);
      for (int k = 0; k < R; ++k) {
        const double a = kBlindDominantStd * rng.normal();
        for (int i = 0; i < d; ++i) mu[i] += a * W[k * d + i];
      }
      Rows basis;
      std::vector<double> dev_std(r, kDevStd);
      if (relevant) {
        // Shift along u_h and in-page deviations orthogonal to W: invisible to span(W).
        set_component(mu, u[h], kRelevantShift);
        basis = u[h];
        const Rows rest = random_orthonormal(rng, W_and_u, r - 1, d);
        basis.insert(basis.end(), rest.begin(), rest.end());
        dev_std[0] = kRelevantDevStd;
      } else {
        basis = random_in_span(rng, W, r, d);
      }
      write_page_keys(s, h, j * c.page_size, std::min(c.tokens, (j + 1) * c.page_size), mu, basis,
                      dev_std, kBlindNoise, rng);
    }
  }
}

void gen_needles(SynthData& s, Rng& rng, const std::vector<Rows>& u) {
  const SynthConfig& c = s.cfg;
  const int d = c.head_dim;
  fill_gaussian(s.keys, rng);
  // One needle token per relevant page, at a random slot; same tokens for every head.
  for (int64_t j : s.relevant_pages) {
    const int64_t t = j * c.page_size + rng.below(c.page_size);
    for (int h = 0; h < c.num_kv_heads; ++h) {
      float* k = &s.keys[(t * c.num_kv_heads + h) * d];
      std::vector<double> kd(k, k + d);
      set_component(kd, u[h], kNeedleLogit);
      for (int i = 0; i < d; ++i) k[i] = static_cast<float>(kd[i]);
    }
  }
}

}  // namespace

const char* synth_name(SynthKind k) {
  switch (k) {
    case SynthKind::gaussian:
      return "gaussian";
    case SynthKind::local_lowrank:
      return "local_lowrank";
    case SynthKind::blind_spot:
      return "blind_spot";
    case SynthKind::needles:
      return "needles";
  }
  return "unknown";
}

SynthKind synth_from_name(const std::string& name) {
  for (SynthKind k :
       {SynthKind::gaussian, SynthKind::local_lowrank, SynthKind::blind_spot, SynthKind::needles})
    if (name == synth_name(k)) return k;
  detail::fail(__func__, "unknown synthetic kind '", name,
               "' (expected gaussian, local_lowrank, blind_spot or needles)");
}

SynthData synth_generate(const SynthConfig& cfg) {
  validate(cfg);
  SynthData s;
  s.cfg = cfg;
  const int d = cfg.head_dim;
  s.keys.resize(static_cast<size_t>(cfg.tokens) * cfg.num_kv_heads * d);
  s.values.resize(s.keys.size());
  s.queries.resize(static_cast<size_t>(cfg.steps) * cfg.num_q_heads * d);
  // Independent streams, so that e.g. the values do not change when the key model does.
  Rng key_rng(cfg.seed, 1), value_rng(cfg.seed, 2), query_rng(cfg.seed, 3), struct_rng(cfg.seed, 4);
  fill_gaussian(s.values, value_rng);
  if (cfg.kind == SynthKind::gaussian) {
    fill_gaussian(s.keys, key_rng);
    fill_gaussian(s.queries, query_rng);
    return s;
  }
  s.relevant_pages = pick_relevant(struct_rng, cfg);
  std::vector<Rows> u(cfg.num_kv_heads);
  for (Rows& uh : u) uh = unit_vec(struct_rng, d);
  switch (cfg.kind) {
    case SynthKind::local_lowrank:
      gen_local_lowrank(s, key_rng, u);
      break;
    case SynthKind::blind_spot:
      gen_blind_spot(s, key_rng, u);  // replaces u_h by a direction orthogonal to W_h
      break;
    default:
      gen_needles(s, key_rng, u);
      break;
  }
  fill_queries(s, u, query_rng);
  return s;
}

}  // namespace locks
