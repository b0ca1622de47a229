// The fixed-budget selection of the backend of this binary (tests/ops: CPU; tests/cuda:
// CUDA) against the float64 reference on group scores built digit by digit: the pages that
// belong to the top `slots` of a row sit in a bin of their own at the first, second or third
// 8-bit digit of the order-preserving key, so the CUDA radix select takes that bin whole and
// stops after one, two or three passes (select_common.cuh, Threshold::bound); keys equal to
// the stopping prefix itself (T = 1.5 exactly, its low digits zero); one tie too many at that
// value (no early stop, ties to the lower index); negative scores; rows whose keys differ
// only in their low bits, where the CUDA radix starts from the row's key range (v29): the
// whole spread inside one last digit (low_bits), a first window whose next one overlaps the
// bits already fixed (window_overlap), and every candidate equal (all_equal: no pass, ties
// to the lower index). One selection chunk (300 pages) and two (2200: the CUDA two-stage
// path).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "backend.h"
#include "locks/reference.h"
#include "select_rows.h"
#include "test_util.h"

namespace locks::test {
namespace {

// How the top of a row is set apart from the rest (hot = the pages the budget must keep).
enum class Band {
  first_digit,
  second_digit,
  third_digit,
  exact_prefix,
  one_tie_too_many,
  negative,
  low_bits,
  window_overlap,
  all_equal
};

const char* band_name(Band b) {
  switch (b) {
    case Band::first_digit:
      return "first_digit";
    case Band::second_digit:
      return "second_digit";
    case Band::third_digit:
      return "third_digit";
    case Band::exact_prefix:
      return "exact_prefix";
    case Band::one_tie_too_many:
      return "one_tie_too_many";
    case Band::negative:
      return "negative";
    case Band::low_bits:
      return "low_bits";
    case Band::window_overlap:
      return "window_overlap";
    case Band::all_equal:
      return "all_equal";
  }
  return "?";
}

// Scores of the hot pages and of the rest of a row, per band. 1.5 = 0x3fc00000 (key
// 0xbfc00000): its key's second digit (0xc0) differs from [1, 1.2)'s (0x80-0x99), and
// [1.5, 1.5 + 2^-10) (third digit 0x00-0x1f) shares 16 bits with
// [1.5 + 2^-8, 1.5 + 2^-8 + 2^-10) (0x80-0x9f), which differs at the third digit.
// 1.5 plus `ulps` units in the last place: keys that differ only in their low bits.
float above_1_5(int ulps) { return std::bit_cast<float>(0x3fc00000u + uint32_t(ulps)); }

float hot_score(Band b, Rng& rng) {
  switch (b) {
    case Band::first_digit:
      return rng.uniform(64.0f, 127.0f);
    case Band::second_digit:
      return rng.uniform(1.5f, 1.503f);
    case Band::third_digit:
      return 1.5f + std::ldexp(1.0f, -8) + rng.uniform(0.0f, std::ldexp(1.0f, -10));
    case Band::exact_prefix:
    case Band::one_tie_too_many:
      return 1.5f;
    case Band::negative:
      return rng.uniform(-1.1f, -1.0f);
    case Band::low_bits:  // the row's keys span 6 bits: one pass from bit 0
      return above_1_5(rng.integer(40, 63));
    case Band::window_overlap:  // 10 bits: a window at bits 9-2, then 7-0
      return above_1_5(rng.integer(700, 1023));
    case Band::all_equal:
      return 1.5f;
  }
  return 0.0f;
}
float rest_score(Band b, Rng& rng) {
  switch (b) {
    case Band::first_digit:
      return rng.uniform(-12.0f, 2.0f);
    case Band::second_digit:
    case Band::exact_prefix:
    case Band::one_tie_too_many:
      return rng.uniform(1.0f, 1.2f);
    case Band::third_digit:
      return 1.5f + rng.uniform(0.0f, std::ldexp(1.0f, -10));
    case Band::negative:
      return rng.uniform(-300.0f, -100.0f);
    case Band::low_bits:
      return above_1_5(rng.integer(0, 39));
    case Band::window_overlap:
      return above_1_5(rng.integer(0, 699));
    case Band::all_equal:
      return 1.5f;
  }
  return 0.0f;
}

// Rows whose every (sequence, KV head) has exactly its `slots` (one more for
// one_tie_too_many) hot pages at random places among its candidates (full pages between the
// sinks and the recent ones), unless the rule takes every candidate; `banded` counts the
// rows that got them.
Rows banded_rows(int M, Band band, const SelectConfig& sc, uint64_t seed, int& banded) {
  Rows rows(M, Kind::random, seed);
  Rng rng(seed * 7 + 1);
  for (int b = 0; b < rows.B; ++b) {
    const SeqRule r = seq_rule(rows.lens[size_t(b)], rows.P, sc);
    for (int h = 0; h < rows.H; ++h) {
      float* s = &rows.scores[(size_t(b) * rows.H + h) * size_t(M)];
      for (int j = 0; j < M; ++j) s[j] = rest_score(band, rng);
      std::vector<int> cand(size_t(r.recent_start - r.sink_end));
      std::iota(cand.begin(), cand.end(), r.sink_end);
      const int hot = r.slots + (band == Band::one_tie_too_many ? 1 : 0);
      if (r.slots < 1 || hot >= int(cand.size())) continue;  // the rule takes every candidate
      for (int i = 0; i < hot; ++i)
        std::swap(cand[size_t(i)], cand[size_t(rng.integer(i, int(cand.size()) - 1))]);
      for (int i = 0; i < hot; ++i) s[cand[size_t(i)]] = hot_score(band, rng);
      ++banded;
    }
  }
  return rows;
}

using SelectThreshold = SelectOnBackend;

TEST_F(SelectThreshold, BinsTakenWholeSelectTheReferencePages) {
  for (const int M : {300, 2200})
    for (const Band band : {Band::first_digit, Band::second_digit, Band::third_digit,
                            Band::exact_prefix, Band::one_tie_too_many, Band::negative,
                            Band::low_bits, Band::window_overlap, Band::all_equal})
      for (const SelectConfig sc : {SelectConfig{16 * 16, 0, 0}, SelectConfig{16 * 16 + 7, 1, 2},
                                    SelectConfig{64 * 16, 2, 3}}) {
        SCOPED_TRACE(testing::Message()
                     << "M " << M << " band " << band_name(band) << " budget " << sc.budget_tokens
                     << " sink " << sc.sink_pages << " recent " << sc.recent_pages);
        int banded = 0;
        const Rows rows = banded_rows(M, band, sc, uint64_t(M) + 13 * int(band), banded);
        EXPECT_GE(banded, 4) << "the case must set a band apart in most rows";
        const SelRun got = run_select(be_.get(), rows, sc);
        const SelectionBuf want = reference(rows, sc, 0.0, got.capacity);
        ASSERT_EQ(got.counts, want.counts);
        for (int b = 0; b < rows.B; ++b)
          for (int h = 0; h < rows.H; ++h) {
            const int64_t row = int64_t(b) * rows.H + h;
            const auto first = got.pages.begin() + row * got.capacity;
            EXPECT_EQ(std::vector<int32_t>(first, first + got.counts[size_t(row)]),
                      want.of(b, h, rows.H))
                << "sequence " << b << " head " << h;
          }
      }
}

}  // namespace
}  // namespace locks::test
