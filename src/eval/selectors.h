// Factories of the individual selectors (one file each); the registry maps names to them.
#pragma once

#include <memory>
#include <string>

#include "locks/eval/selector.h"

namespace locks::eval {

std::unique_ptr<PageSelector> make_full();
std::unique_ptr<PageSelector> make_oracle();
std::unique_ptr<PageSelector> make_quest();
std::unique_ptr<PageSelector> make_shared_proj(const SelectorParams& p);
std::unique_ptr<PageSelector> make_shadowkv(const SelectorParams& p);
std::unique_ptr<PageSelector> make_rocket(const SelectorParams& p, bool snapkv);
std::unique_ptr<PageSelector> make_locks(const SelectorParams& p, bool quantized,
                                         bool weighted = false);
// "lx-..." names: LOCKS summary variants (selector_locks_variant.cpp).
std::unique_ptr<PageSelector> make_locks_variant(const std::string& name, const SelectorParams& p);
// "locks_h2" and "h2-..." names: two-level LOCKS (selector_locks_h2.cpp).
std::unique_ptr<PageSelector> make_locks_h2(const std::string& name, const SelectorParams& p);

}  // namespace locks::eval
