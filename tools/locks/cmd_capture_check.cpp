// `locks inspect`: validates a KV capture completely (meta.json, every layer file's
// dtype, shape and values) without evaluating anything, and prints what it holds. Meant
// for whoever writes captures from a model run (docs/capture_format.md).
#include <cmath>
#include <iomanip>
#include <iostream>

#include "command.h"
#include "locks/eval/capture.h"
#include "usage.h"

namespace {

constexpr const char* kUsage =
    "usage: locks inspect --capture DIR\n"
    "Reads and validates every file of a KV capture (docs/capture_format.md); prints the\n"
    "metadata and, per layer, the RMS of keys, values and queries. Exit 1 on any problem.\n";

double rms(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return x.empty() ? 0.0 : std::sqrt(s / double(x.size()));
}

int run_capture_check(const std::vector<std::string>& args) {
  using namespace locks::eval;
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    (args.empty() ? std::cerr : std::cout) << kUsage;
    return args.empty() ? 2 : 0;
  }
  locks::cli::Args o(args, {"--capture"}, {});
  const std::string dir = o.required("--capture");
  CaptureMeta m = read_capture_meta(dir);
  check_capture_files(dir, m);
  std::cout << "model " << m.model << ": " << m.num_layers << " layer(s), tokens " << m.tokens
            << ", steps " << m.steps << ", kv_heads " << m.kv_heads << ", q_heads " << m.q_heads
            << ", head_dim " << m.head_dim << ", " << m.positional_encoding << ", keys " << m.keys
            << ", " << m.dtype << "\n";
  std::cout << std::setprecision(4);
  for (int layer : m.layers) {
    LayerCapture c = load_capture_layer(dir, m, layer);
    std::cout << "layer " << layer << ": rms k " << rms(c.k) << ", v " << rms(c.v) << ", q "
              << rms(c.q);
    if (!c.k_prerope.empty()) std::cout << ", k_prerope " << rms(c.k_prerope);
    if (c.obs_steps) std::cout << ", qobs " << c.obs_steps << " steps";
    std::cout << "\n";
  }
  std::cout << "capture OK\n";
  return 0;
}

}  // namespace

LOCKS_COMMAND(inspect, "inspect", "validate a KV capture (all files) and summarise it",
              run_capture_check);
