// validate_select, select_capacity (select.h): the budget rules of rules.h with errors.
#include "locks/error.h"
#include "locks/rules.h"
#include "locks/select.h"

namespace locks {

void validate_select(const SelectConfig& cfg, int page_size) {
  LOCKS_REQUIRE(page_size >= 1, "page_size must be >= 1, got ", page_size);
  LOCKS_REQUIRE(cfg.budget_tokens >= 0, "budget_tokens must be >= 0, got ", cfg.budget_tokens);
  LOCKS_REQUIRE(cfg.sink_pages >= 0, "sink_pages must be >= 0, got ", cfg.sink_pages);
  LOCKS_REQUIRE(cfg.recent_pages >= 0, "recent_pages must be >= 0, got ", cfg.recent_pages);
  LOCKS_REQUIRE(cfg.dense_below >= 0, "dense_below must be >= 0 (0 = off), got ", cfg.dense_below);
  LOCKS_REQUIRE(rules::budget_valid(cfg.budget_tokens, cfg.sink_pages, cfg.recent_pages, page_size),
                "budget of ", cfg.budget_tokens, " tokens gives ",
                rules::budget_pages(cfg.budget_tokens, page_size), " pages of ", page_size,
                ", fewer than sink (", cfg.sink_pages, ") + recent (", cfg.recent_pages,
                ") + 1 tail page");
  LOCKS_REQUIRE(rules::tau_valid(cfg.tau), "tau must be 0 (fixed budget) or in (0, 1], got ",
                cfg.tau);
  LOCKS_REQUIRE(cfg.floor_pages >= 0, "floor_pages must be >= 0, got ", cfg.floor_pages);
  // The upper bound only binds the adaptive budget: with tau = 0 the floor is unused, and
  // the default floor of 1 must not reject a budget of exactly sink + recent + tail.
  LOCKS_REQUIRE(cfg.tau == 0.0f || rules::floor_valid(cfg.floor_pages, cfg.budget_tokens,
                                                      cfg.sink_pages, cfg.recent_pages, page_size),
                "floor_pages must be in [0, ",
                rules::scored_slots(cfg.budget_tokens, cfg.sink_pages, cfg.recent_pages, page_size),
                "] (the budget's pages beyond sink + recent + tail), got ", cfg.floor_pages);
}

int select_capacity(const SelectConfig& cfg, int page_size, int max_blocks_per_seq) {
  validate_select(cfg, page_size);
  LOCKS_REQUIRE(max_blocks_per_seq >= 1, "max_blocks_per_seq must be >= 1, got ",
                max_blocks_per_seq);
  return rules::select_capacity(cfg.budget_tokens, page_size, max_blocks_per_seq, cfg.dense_below);
}

}  // namespace locks
