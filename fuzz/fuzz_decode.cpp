// libFuzzer harness of the CPU decode contract (contract.h): the whole step (decode,
// decode_two_level), or its ops one by one with a selection the caller may edit before the
// attention. The input chooses the shape (page size, heads, head_dim, dtype, GQA group,
// rank, precision), the selection rules (budget, sinks, recent pages, tau, floor, minimum
// context), the two-level options (S, rank, extent, alpha, min_groups, first groups,
// flat_below_groups), the batch the run is called with (its size, block table, lengths) and
// whether a key or the query is non-finite; in the op-by-op mode a cache write
// (cache_write_slots) may come first and the selection may be handed to token rows
// (request_rows). Each call either succeeds, with a selection of
// ascending real pages of each sequence within the capacity and a finite log-sum-exp where
// every input was finite, or throws a locks::Error with its outputs as they were (contract.h:
// outputs whole or not at all). Any other exception, a sanitizer report or an output touched
// by a refused call is a finding.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "locks/cache_write.h"
#include "locks/contract.h"
#include "locks/dtype.h"
#include "locks/error.h"
#include "locks/reference.h"
#include "locks/summary.h"
#include "locks/super_summary.h"

namespace {

using namespace locks;

// The input as a stream of small choices; past its end every read is 0.
struct Input {
  const uint8_t* p;
  size_t n, i = 0;
  uint8_t u8() { return i < n ? p[i++] : 0; }
  int pick(int k) { return u8() % k; }
  int16_t i16() { return int16_t(uint16_t(u8()) | uint16_t(u8()) << 8); }
  float f32() {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k) u |= uint32_t(u8()) << (8 * k);
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// (Choices are laid out so that a zero byte, which is also what a read past the end gives,
// picks the ordinary, valid value: short inputs reach the run, not only the refusals.)

// Cache contents: a small deterministic generator (the input picks its seed).
struct Lcg {
  uint64_t s;
  float next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return float(int32_t(s >> 33) % 2001) / 1000.0f;  // [-2, 2]
  }
};

void store(void* base, DType t, size_t i, float x) {
  if (t == DType::f32) {
    static_cast<float*>(base)[i] = x;
  } else if (t == DType::f16) {
    static_cast<uint16_t*>(base)[i] = float_to_half(x);
  } else {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    static_cast<uint16_t*>(base)[i] = uint16_t(u >> 16);  // bf16 by truncation
  }
}

struct Outputs {
  std::vector<float> out, lse;
  std::vector<int32_t> pages, counts;
  Outputs(int B, int Hq, int d, int Hkv, int cap)
      : out(size_t(B) * Hq * d, -3.0f),
        lse(size_t(B) * Hq, -3.0f),
        pages(size_t(B) * Hkv * cap, -7),
        counts(size_t(B) * Hkv, -7) {}
  bool untouched() const {
    return std::all_of(out.begin(), out.end(), [](float x) { return x == -3.0f; }) &&
           std::all_of(lse.begin(), lse.end(), [](float x) { return x == -3.0f; }) &&
           std::all_of(pages.begin(), pages.end(), [](int32_t x) { return x == -7; }) &&
           std::all_of(counts.begin(), counts.end(), [](int32_t x) { return x == -7; });
  }
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  omp_set_num_threads(1);  // the inputs are tiny; one thread keeps runs fast and repeatable
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in{data, size};
  // The modes first, so that short inputs reach every path.
  const int mode = in.u8();
  const bool two_level = (mode & 1) != 0;
  const bool wild = (mode & 14) == 14;      // else lengths within the table and ids in range
  const int nonfinite = (mode >> 4) % 8;    // 1: a NaN key, 2: an Inf in q
  const bool op_by_op = (mode & 128) != 0;  // flat: the ops one by one, a selection edited
  static const int kPageSizes[] = {16, 2, 4, 8, 32, 3};
  // Valid head dims (kv_cache.h: even, in [8, 512]) of every kind: the common ones, Phi-2's 80,
  // one that is no multiple of 16 (10); and an odd one that every entry point must refuse.
  static const int kHeadDims[] = {32, 64, 96, 128, 256, 80, 10, 47};
  CacheLayout L;
  L.num_blocks = 1 + in.pick(24);
  L.page_size = kPageSizes[in.pick(6)];
  L.num_kv_heads = 1 + in.pick(3);
  L.head_dim = kHeadDims[in.pick(8)];
  L.dtype = static_cast<DType>(in.pick(3));
  const int G = 1 + in.pick(5);
  static const int kRanks[] = {8, 1, 2, 4, 15, 0, 16, 3};
  const int rank = kRanks[in.pick(8)];
  const Precision prec = static_cast<Precision>(in.pick(2));
  DecodeParams p;
  p.cache = L;
  p.num_q_heads = G * L.num_kv_heads + (in.pick(16) == 15 ? 1 : 0);
  p.max_batch = 1 + in.pick(3);
  p.max_blocks_per_seq = 1 + in.pick(10);
  p.select.budget_tokens = in.pick(8) == 7 ? in.i16() : L.page_size * (1 + in.pick(64));
  p.select.sink_pages = in.pick(4);
  p.select.recent_pages = in.pick(4);
  if (in.pick(4) == 3) p.select.tau = in.pick(2) ? in.f32() : 0.9f;
  p.select.floor_pages = in.pick(4);
  if (in.pick(4) == 3) p.select.dense_below = in.i16();
  p.two_level = two_level;
  SuperLayout U;
  U.group_pages = 2 + in.pick(6);
  U.page_size = L.page_size;
  U.num_kv_heads = L.num_kv_heads;
  U.head_dim = L.head_dim;
  U.rank = 1 + in.pick(8);
  U.extent = in.pick(4) != 3;
  TwoLevelConfig& T = p.two;
  const double alphas[] = {40.0, 1.0, 2.0, double(in.f32())};
  T.alpha = alphas[in.pick(4)];
  static const int kMinGroups[] = {32, 1, 2, 4, 8, 0};
  static const int kFirstGroups[] = {1, 0, 2};
  static const int kFlatBelow[] = {8, 0, 1, 2, 4, 16};
  T.min_groups = kMinGroups[in.pick(6)];
  T.first_groups = kFirstGroups[in.pick(3)];
  T.flat_below_groups = kFlatBelow[in.pick(6)];
  T.use_extent = U.extent && in.pick(4) != 3;
  T.mix = T.use_extent && in.pick(4) == 3;
  T.agg = static_cast<GroupAgg>(in.pick(2));
  // The batch the run is called with: its size, table width and entries, lengths.
  const int B = 1 + in.pick(4), M = 1 + in.pick(11);
  std::vector<int32_t> table(size_t(B) * M), lens(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    lens[size_t(b)] = wild ? int32_t(in.i16()) : 1 + in.pick(M * L.page_size);
    for (int j = 0; j < M; ++j)
      table[size_t(b) * M + j] =
          wild ? in.pick(int(L.num_blocks) + 2) - 1 : int32_t((b * M + j) % L.num_blocks);
  }
  const int S = U.group_pages;
  const int groups = (std::max(wild ? 1 : p.max_blocks_per_seq, M) + S - 1) / S;
  U.num_slots = int64_t(B) * groups;  // slot b * groups + j: group j of sequence b
  p.super = U;
  Lcg rng{uint64_t(in.u8()) + 1};

  try {
    p.summary = summary_layout_for(L, rank, prec);
    const DecodePlan plan = cpu::plan_decode(p);
    if (plan.workspace_bytes > (size_t(64) << 20)) return 0;
    const size_t elems = size_t(L.num_blocks) * L.block_elems(), es = L.dtype == DType::f32 ? 4 : 2;
    std::vector<std::byte> k(elems * es), v(elems * es);
    for (size_t i = 0; i < elems; ++i) {
      store(k.data(), L.dtype, i, rng.next());
      store(v.data(), L.dtype, i, rng.next());
    }
    if (nonfinite == 1) store(k.data(), L.dtype, elems / 2, NAN);
    const KvCacheView cache{k.data(), v.data(), L};
    SummaryStore summaries(p.summary);
    std::vector<int32_t> all(size_t(L.num_blocks));
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    cpu::summary_build(cache, all.data(), L.num_blocks, summaries.view());  // refuses the NaN
    const int Hq = p.num_q_heads, d = L.head_dim;
    std::vector<float> q(size_t(B) * Hq * d);
    for (float& x : q) x = rng.next();
    if (nonfinite == 2) q[q.size() / 3] = INFINITY;
    const BatchView batch{table.data(), M, lens.data(), B, M};
    const QueryView qv{q.data(), Hq, DType::f32, 0};
    std::vector<std::byte> ws_mem(plan.workspace_bytes + 256);
    void* ws = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(ws_mem.data()) + 255) &
                                       ~uintptr_t(255));
    Outputs o(B, Hq, d, L.num_kv_heads, plan.capacity);
    const Selection sel{o.pages.data(), o.counts.data(), plan.capacity};
    try {
      if (p.two_level) {
        // Super summaries of every complete group of the table; a group whose blocks are out
        // of range gets no summary and slot -1.
        SuperStore supers(U);
        std::vector<int32_t> slots(size_t(B) * groups, -1), gblocks, gslots;
        for (int b = 0; b < B; ++b)
          for (int j = 0; j < groups && lens[size_t(b)] > 0; ++j) {
            if ((j + 1) * S * L.page_size > std::min(lens[size_t(b)], M * L.page_size)) break;
            bool ok = true;
            for (int t = 0; t < S; ++t) {
              const int32_t id = table[size_t(b) * M + j * S + t];
              ok = ok && id >= 0 && id < L.num_blocks;
              gblocks.push_back(id);
            }
            if (!ok) {
              gblocks.resize(gblocks.size() - S);
              continue;
            }
            slots[size_t(b) * groups + j] = b * groups + j;
            gslots.push_back(b * groups + j);
          }
        cpu::super_build(cache, gblocks.data(), gslots.data(), int64_t(gslots.size()),
                         supers.view());
        if (in.pick(8) == 7 && !slots.empty()) slots[in.pick(int(slots.size()))] = in.i16();
        const SuperTableView st{slots.data(), groups, groups};
        cpu::decode_two_level(plan, {ws, plan.workspace_bytes}, cache, summaries.view(),
                              supers.view(), st, batch, qv, {o.out.data(), o.lse.data()}, &sel);
      } else if (op_by_op) {
        // The contract's ops one by one (what the torch operators expose), each refused
        // call leaving its own outputs untouched; then the attention over a selection the
        // caller may have edited (it must refuse one that is not ascending real pages).
        const Workspace w{ws, plan.workspace_bytes};
        if (in.pick(2) == 1) {
          // A step's cache write first (cache_write_slots): slots in range, padding, past the
          // cache or anything, duplicates by chance; rows at odd strides. A refused call
          // leaves the cache as it was; a call that succeeds leaves in each named slot the row
          // of the last token naming it.
          const int n = in.pick(6), H = L.num_kv_heads;
          std::vector<int32_t> slots(static_cast<size_t>(n));
          for (int32_t& x : slots)
            x = in.pick(8) == 7 ? in.i16() : in.pick(int(L.num_blocks) * L.page_size + 1) - 1;
          const int64_t hs = d + in.pick(3), ts = H * hs + in.pick(3);
          std::vector<std::byte> rk(size_t(n * ts + 1) * es), rv(rk.size());
          for (size_t i = 0; i < rk.size() / es; ++i) {
            store(rk.data(), L.dtype, i, rng.next());
            store(rv.data(), L.dtype, i, rng.next());
          }
          if (nonfinite == 3 && n > 0) store(rv.data(), L.dtype, size_t(hs), NAN);
          const TokenRows tr{rk.data(), rv.data(), n, ts, hs, ts, hs};
          const std::vector<std::byte> k0 = k, v0 = v;
          const SummaryView sv = summaries.view();
          try {
            cpu::cache_write_slots({k.data(), v.data(), L}, tr, slots.data(), &sv);
            for (int t = 0; t < n; ++t) {
              const int32_t x = slots[size_t(t)];
              bool last = x >= 0;
              for (int u = t + 1; u < n; ++u) last = last && slots[size_t(u)] != x;
              for (int h = 0; last && h < H; ++h) {
                const size_t at = size_t(L.offset(x / L.page_size, x % L.page_size, h)) * es;
                if (std::memcmp(k.data() + at, rk.data() + size_t(t * ts + h * hs) * es,
                                size_t(d) * es) != 0 ||
                    std::memcmp(v.data() + at, rv.data() + size_t(t * ts + h * hs) * es,
                                size_t(d) * es) != 0)
                  std::abort();
              }
            }
          } catch (const Error&) {
            if (k != k0 || v != v0) std::abort();  // a refused call wrote the cache
          }
        }
        const size_t rows = size_t(B) * Hq * M;
        std::vector<float> hs(rows, -5.0f), gs(size_t(B) * L.num_kv_heads * M, -5.0f);
        auto all_are = [](const std::vector<float>& x, float v) {
          return std::all_of(x.begin(), x.end(), [v](float y) { return y == v; });
        };
        try {
          cpu::score_pages(plan, w, summaries.view(), batch, qv, hs.data());
        } catch (const Error&) {
          if (!all_are(hs, -5.0f)) std::abort();
          throw;
        }
        try {
          cpu::aggregate_select(plan, w, batch, hs.data(), gs.data(), sel);
        } catch (const Error&) {
          if (!all_are(gs, -5.0f) || !o.untouched()) std::abort();
          throw;
        }
        if (in.pick(2) == 1) {
          // The selection as requests of T token rows (request_rows, speculative verification):
          // rows ending at each sequence's length (wild: now and then any length), an output
          // capacity of the plan's or one more. A refused call writes nothing; one that
          // succeeds gives the reference's rows (ref::request_rows: the request's pages up to
          // the row's own last page, then that page where the list lacks it and has room, -1
          // padded).
          const int T = 1 + in.pick(4), R = B * T, H = L.num_kv_heads;
          const int cap = plan.capacity + in.pick(2);
          std::vector<int32_t> rl(static_cast<size_t>(R)), rp(size_t(R) * H * cap, -9),
              rc(size_t(R) * H, -9);
          for (int r = 0; r < R; ++r)
            rl[size_t(r)] =
                wild && in.pick(4) == 3 ? int32_t(in.i16()) : lens[size_t(r / T)] - (T - 1 - r % T);
          try {
            const RequestRows rows{lens.data(), rl.data(), B, T};
            cpu::request_rows(rows, sel, H, L.page_size, {rp.data(), rc.data(), cap});
            std::vector<int32_t> wp(rp.size()), wc(rc.size());  // the reference's rows
            ref::request_rows(rows, sel, H, L.page_size, {wp.data(), wc.data(), cap});
            if (rp != wp || rc != wc) std::abort();
          } catch (const Error&) {
            auto untouched = [](const std::vector<int32_t>& x) {
              return std::all_of(x.begin(), x.end(), [](int32_t y) { return y == -9; });
            };
            if (!untouched(rp) || !untouched(rc)) std::abort();
          }
        }
        const int edit = in.pick(4);  // 1: a page, 2: a count, 3: a page of another row
        if (edit == 1 || edit == 3) o.pages[in.pick(int(o.pages.size()))] = in.i16();
        if (edit == 2) o.counts[in.pick(int(o.counts.size()))] = in.i16();
        const std::vector<float> out0 = o.out, lse0 = o.lse;
        try {
          cpu::decode_attention_sparse(plan, w, cache, batch, qv, sel,
                                       {o.out.data(), o.lse.data()});
        } catch (const Error&) {
          if (o.out != out0 || o.lse != lse0) std::abort();
          return 0;
        }
      } else {
        cpu::decode(plan, {ws, plan.workspace_bytes}, cache, summaries.view(), batch, qv,
                    {o.out.data(), o.lse.data()}, &sel);
      }
    } catch (const Error&) {
      if (!op_by_op && !o.untouched()) std::abort();  // a refused call wrote an output
      return 0;
    }
    // Success: every row a selection of ascending real pages, finite where the inputs were.
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < L.num_kv_heads; ++h) {
        const int64_t row = int64_t(b) * L.num_kv_heads + h;
        const int n = o.counts[size_t(row)];
        const int pages = (lens[size_t(b)] + L.page_size - 1) / L.page_size;
        if (n < 1 || n > plan.capacity || n > pages) std::abort();
        const int32_t* s = o.pages.data() + row * plan.capacity;
        for (int i = 0; i < n; ++i)
          if (s[i] < 0 || s[i] >= pages || (i > 0 && s[i] <= s[i - 1])) std::abort();
      }
    if (nonfinite == 0)
      for (float x : o.lse)
        if (!std::isfinite(x)) std::abort();
  } catch (const Error&) {  // refused at the plan or a summary build: nothing to check
  }
  return 0;
}
