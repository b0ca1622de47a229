// `locks synth`: writes a synthetic KV capture (locks_synth's generators) in the format
// `locks eval` reads (docs/capture_format.md).
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/capture.h"
#include "locks/io/files.h"
#include "locks/synthetic.h"
#include "options.h"
#include "usage.h"

namespace {

constexpr const char* kUsage =
    "usage: locks synth --kind gaussian|local_lowrank|blind_spot|needles --out DIR\n"
    "                   [--tokens 16384] [--kv-heads 2] [--q-heads 8] [--head-dim 128]\n"
    "                   [--page-size 16] [--steps 4] [--obs-window 16] [--seed 0] [--force]\n"
    "Writes DIR/meta.json and DIR/layer0_{k,v,q,qobs}.npy (float32). The observation window\n"
    "(qobs, for SnapKV) is --obs-window further queries drawn like the decode queries.\n"
    "DIR is written whole or not at all; an existing non-empty DIR is refused unless --force.\n";

int run_synth_cmd(const std::vector<std::string>& args) {
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;  // no arguments is a usage error
    return args.empty() ? 2 : 0;
  }
  const locks::cli::SynthOptions o = locks::cli::parse_synth_options(args);
  const std::string why = locks::io::StagedDir::check_target(o.out, o.force);
  if (!why.empty()) throw locks::cli::UsageError(why);
  const locks::SynthConfig& c = o.synth;
  const std::string& out = o.out;
  const long long steps = o.steps, obs = o.obs_window, seed = o.seed;
  std::cerr << "[synth] generating " << locks::synth_name(c.kind) << ", " << c.tokens << " tokens"
            << std::endl;
  locks::SynthData s = locks::synth_generate(c);

  CaptureMeta m;
  m.model = std::string("synthetic/") + locks::synth_name(c.kind);
  m.num_layers = 1;
  m.layers = {0};
  m.kv_heads = c.num_kv_heads;
  m.q_heads = c.num_q_heads;
  m.head_dim = c.head_dim;
  m.positional_encoding = "none";
  m.keys = "post_rope";
  m.tokens = c.tokens;
  m.steps = steps;
  m.dtype = "float32";
  nlohmann::json extra;
  extra["synthetic"] = {{"kind", locks::synth_name(c.kind)},
                        {"seed", seed},
                        {"page_size", c.page_size},
                        {"relevant_pages", s.relevant_pages},
                        {"obs_window", obs}};
  m.extra_json = extra.dump();

  LayerCapture l;
  l.layer = 0;
  l.k = std::move(s.keys);
  l.v = std::move(s.values);
  const size_t qn = size_t(steps) * c.num_q_heads * c.head_dim;
  l.q.assign(s.queries.begin(), s.queries.begin() + qn);
  l.q_obs.assign(s.queries.begin() + qn, s.queries.end());
  l.obs_steps = obs;
  locks::io::StagedDir staged(out, o.force);
  write_capture_layer(staged.path(), m, l);
  write_capture_meta(staged.path(), m);
  staged.commit();
  std::cerr << "[synth] wrote " << out << " (relevant pages: " << s.relevant_pages.size() << ")"
            << std::endl;
  return 0;
}

}  // namespace

LOCKS_COMMAND(synth, "synth", "write a synthetic KV capture (gaussian, local_lowrank, ...)",
              run_synth_cmd);
