// supports(): the capability table of each backend (CPU: what locks_core implements; CUDA:
// locks/cuda/limits.h, the kernels' own table).
#include "locks/support.h"

#include <sstream>

#include "locks/cuda/limits.h"
#include "locks/error.h"
#include "locks/kv_cache.h"

namespace locks {
namespace {

template <typename... Args>
Support no(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return {false, os.str()};
}

bool precision_known(Precision p) { return int(p) == 0 || int(p) == 1; }

Support cpu_supports(const DecodeShape& s) {
  const int d = s.head_dim;
  if (!head_dim_valid(d))
    return no("cpu: head_dim must be even and in [", kMinHeadDim, ", ", kMaxHeadDim, "], got ", d);
  if (s.page_size < 2 || s.page_size > 256)
    return no("cpu: page_size must be in [2, 256], got ", s.page_size);
  if (s.group < 1) return no("cpu: GQA group must be >= 1, got ", s.group);
  if (!dtype_known(s.kv_dtype)) return no("cpu: unknown cache dtype code ", int(s.kv_dtype));
  if (s.rank < 1 || s.rank >= s.page_size || s.rank > d)
    return no("cpu: rank must be in [1, min(page_size - 1, head_dim)], got ", s.rank);
  if (!precision_known(s.precision)) return no("cpu: unknown precision code ", int(s.precision));
  return {};
}

std::string head_dim_list() {
  std::ostringstream os;
  for (const int d : cuda::limits::kHeadDims) os << (os.tellp() > 0 ? ", " : "") << d;
  return os.str();
}

Support cuda_supports(const DecodeShape& s) {
  namespace lim = cuda::limits;
  if (s.page_size != lim::kPageSize)
    return no("cuda: page_size must be ", lim::kPageSize, ", got ", s.page_size);
  if (!lim::head_dim_supported(s.head_dim))
    return no("cuda: head_dim must be one of ", head_dim_list(), ", got ", s.head_dim);
  if (!lim::group_supported(s.group))
    return no("cuda: GQA group (num_q_heads / num_kv_heads) must be in [1, ", lim::kMaxGroup,
              "], got ", s.group);
  if (!dtype_known(s.kv_dtype)) return no("cuda: unknown cache dtype code ", int(s.kv_dtype));
  // Attention reads bf16 or f16 caches (scoring and the summary builds also f32).
  if (s.kv_dtype == DType::f32)
    return no("cuda: attention needs a bfloat16 or float16 cache, got float32");
  if (s.rank < 1 || s.rank >= lim::kPageSize || s.rank > s.head_dim)
    return no("cuda: rank must be in [1, ", lim::kPageSize - 1, "], got ", s.rank);
  if (!precision_known(s.precision)) return no("cuda: unknown precision code ", int(s.precision));
  return {};
}

}  // namespace

Support supports(Backend backend, const DecodeShape& shape) {
  switch (backend) {
    case Backend::cpu:
      return cpu_supports(shape);
    case Backend::cuda:
      return cuda_supports(shape);
  }
  return no("unknown backend code ", int(backend));
}

void require_supported(Backend backend, const DecodeShape& shape) {
  const Support s = supports(backend, shape);
  if (!s.ok) throw Unsupported(s.reason);
}

}  // namespace locks
