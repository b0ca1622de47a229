// libFuzzer harness of npy_load: any bytes are either a valid float32/float16 array whose
// size matches its shape, or a locks::Error. A crash, a sanitizer report, another exception
// type or a hang is a finding.
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "locks/error.h"
#include "locks/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = locks::fuzz::scratch() / "input.npy";
  locks::fuzz::write_bytes(path, data, size);
  try {
    const locks::NpyArray a = locks::npy_load(path.string());
    int64_t n = 1;
    for (int64_t s : a.shape) n *= s;
    if (n != static_cast<int64_t>(a.data.size())) std::abort();  // shape and data disagree
    if (a.source_dtype != "float32" && a.source_dtype != "float16") std::abort();
  } catch (const locks::Error&) {
  }
  return 0;
}
