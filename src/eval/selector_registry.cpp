#include "locks/error.h"
#include "selectors.h"

namespace locks::eval {

std::vector<std::string> selector_names() {
  return {"full",          "oracle",     "quest",       "shared_proj", "shadowkv",     "rocket",
          "rocket_snapkv", "locks_fp32", "locks_quant", "locks_wq",    "locks_wq_fp32"};
}

std::unique_ptr<PageSelector> make_selector(const std::string& name, const SelectorParams& p) {
  if (name == "full") return make_full();
  if (name == "oracle") return make_oracle();
  if (name == "quest") return make_quest();
  if (name == "shared_proj") return make_shared_proj(p);
  if (name == "shadowkv") return make_shadowkv(p);
  if (name == "rocket") return make_rocket(p, false);
  if (name == "rocket_snapkv") return make_rocket(p, true);
  if (name == "locks_fp32") return make_locks(p, false);
  if (name == "locks_quant") return make_locks(p, true);
  if (name == "locks_wq") return make_locks(p, true, true);
  if (name == "locks_wq_fp32") return make_locks(p, false, true);
  if (name.rfind("lx", 0) == 0) return make_locks_variant(name, p);
  if (name == "locks_h2" || name.rfind("h2", 0) == 0) return make_locks_h2(name, p);
  std::string known;
  for (const auto& n : selector_names()) known += (known.empty() ? "" : ", ") + n;
  LOCKS_REQUIRE(false, "unknown method \"", name, "\" (known: ", known, ")");
  return nullptr;
}

}  // namespace locks::eval
