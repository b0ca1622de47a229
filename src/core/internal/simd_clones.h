// LOCKS_SIMD_CLONES: compile a hot kernel for AVX-512, AVX2+FMA and baseline x86-64, picked
// at load time by the CPU (GCC target_clones / ifunc). The build needs no -march flag, so the
// binary runs on any x86-64 machine and still uses wide vectors where they exist. Each clone
// is deterministic; clones may differ from each other in the last bits (FMA contraction).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(LOCKS_NO_CLONES)
#define LOCKS_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LOCKS_SIMD_CLONES
#endif
