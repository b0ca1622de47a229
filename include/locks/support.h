// Capability query: can a backend run the decode step on this shape? One answer for the
// CLI, the torch ops, the HF drop-in and the plan (plan_decode throws locks::Unsupported
// with the same reason). The CPU answer is what locks_core implements; the CUDA answer comes
// from the table in locks/cuda/limits.h (answered also by builds without CUDA).
#pragma once

#include <string>

#include "locks/dtype.h"
#include "locks/summary.h"

namespace locks {

enum class Backend : int { cpu = 0, cuda = 1 };
inline constexpr const char* backend_name(Backend b) { return b == Backend::cpu ? "cpu" : "cuda"; }

struct DecodeShape {
  int head_dim = 128;
  int page_size = 16;
  int group = 1;  // num_q_heads / num_kv_heads (GQA); 1 = multi-head attention
  DType kv_dtype = DType::bf16;
  int rank = 8;
  Precision precision = Precision::quant;
};

struct Support {
  bool ok = true;
  std::string reason;  // empty when ok; else names the first unsupported field and the limit
  explicit operator bool() const { return ok; }
};

// The whole decode step (summary builds, scoring, aggregation, selection, attention).
Support supports(Backend backend, const DecodeShape& shape);
// Throws locks::Unsupported with the reason unless supported.
void require_supported(Backend backend, const DecodeShape& shape);

}  // namespace locks
