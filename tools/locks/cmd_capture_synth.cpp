// `locks synth`: writes a synthetic KV capture (locks_synth's generators) in the format
// `locks eval` reads (docs/capture_format.md).
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "locks/error.h"
#include "locks/eval/capture.h"
#include "locks/synthetic.h"
#include "usage.h"

namespace {

constexpr const char* kUsage =
    "usage: locks synth --kind gaussian|local_lowrank|blind_spot|needles --out DIR\n"
    "                   [--tokens 16384] [--kv-heads 2] [--q-heads 8] [--head-dim 128]\n"
    "                   [--page-size 16] [--steps 4] [--obs-window 16] [--seed 0]\n"
    "Writes DIR/meta.json and DIR/layer0_{k,v,q,qobs}.npy (float32). The observation window\n"
    "(qobs, for SnapKV) is --obs-window further queries drawn like the decode queries.\n";

int run_synth_cmd(const std::vector<std::string>& args) {
  namespace fs = std::filesystem;
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;  // no arguments is a usage error
    return args.empty() ? 2 : 0;
  }
  locks::cli::Args o(args,
                     {"--kind", "--out", "--tokens", "--kv-heads", "--q-heads", "--head-dim",
                      "--page-size", "--steps", "--obs-window", "--seed"},
                     {});
  locks::SynthConfig c;
  c.kind = locks::synth_from_name(o.required("--kind"));
  const std::string out = o.required("--out");
  c.tokens = o.integer("--tokens", 16384, 1, int64_t(1) << 31);
  c.num_kv_heads = static_cast<int>(o.integer("--kv-heads", 2, 1, 1024));
  c.num_q_heads = static_cast<int>(o.integer("--q-heads", 8, 1, 4096));
  c.head_dim = static_cast<int>(o.integer("--head-dim", 128, 16, 256));
  c.page_size = static_cast<int>(o.integer("--page-size", 16, 2, 256));
  const long long steps = o.integer("--steps", 4, 1, 1 << 16);
  const long long obs = o.integer("--obs-window", 16, 0, 1 << 16);
  const long long seed = o.integer("--seed", 0, 0, (1LL << 62));
  c.seed = static_cast<uint64_t>(seed);
  // The generator draws every query i.i.d. from one distribution (its own stream), so the
  // first `steps` are the decode queries and the rest the observation window.
  c.steps = static_cast<int>(steps + obs);
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
  fs::create_directories(out);
  write_capture_meta(out, m);
  write_capture_layer(out, m, l);
  std::cerr << "[synth] wrote " << out << " (relevant pages: " << s.relevant_pages.size() << ")"
            << std::endl;
  return 0;
}

}  // namespace

LOCKS_COMMAND(synth, "synth", "write a synthetic KV capture (gaussian, local_lowrank, ...)",
              run_synth_cmd);
