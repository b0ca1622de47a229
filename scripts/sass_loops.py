#!/usr/bin/env python3
"""Instruction mix of a kernel's loops, from SASS (no GPU needed).

  scripts/sass_loops.py FILE.cu PATTERN [--top N]

Compiles FILE.cu for sm_90a to a cubin (nvcc, this repository's include paths), disassembles it
with cuobjdump, and for every function whose mangled name contains PATTERN prints its
instruction count, then each loop (a backward branch and the code it jumps back over,
innermost first) with its length, its HMMA count and its opcodes by count. The innermost loop
holding HMMA instructions is the stage loop of the tensor-core kernels (score_mma: one stage of
4 pages a warp; super_score: one pass of 4 query heads). Static counts: a loop's dynamic
instructions differ by the branches it skips (rare paths, e.g. score_mma's max-shifted
log-sum-exp, count here but seldom run).

cuobjdump is not in this machine's CUDA toolkit; PyPI's nvidia-cuda-cuobjdump holds it:
  pip download --no-deps nvidia-cuda-cuobjdump -d /tmp/w && unzip -o /tmp/w/*.whl -d /tmp/w
  export CUOBJDUMP=/tmp/w/nvidia/cu13/bin/cuobjdump   (or put its folder on PATH)
Instance names: score_mma<D, NT1, CP, HL, NG, QV> mangles as e.g. Li128ELi1ELi128ELb1ELi1ELb0
(d 128, one n-tile, 128 pages, hi/lo, one scale a row, fp32 query: the G <= 4 instance).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sass_of(cu: str) -> str:
    nvcc = os.environ.get("NVCC", "/usr/local/cuda/bin/nvcc")
    cuobjdump = os.environ.get("CUOBJDUMP", "cuobjdump")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "k.cubin")
        subprocess.run([nvcc, "-O3", "-DNDEBUG", "--generate-code=arch=compute_90a,code=sm_90a",
                        "--expt-relaxed-constexpr", "-std=c++17", f"-I{ROOT}/include",
                        f"-I{ROOT}/src/cuda", f"-I{ROOT}/src/common", "-cubin", cu, "-o", cubin],
                       check=True)
        return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True,
                              text=True).stdout


def opcode(ins: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cu")
    ap.add_argument("pattern")
    ap.add_argument("--top", type=int, default=25, help="opcodes shown a loop")
    a = ap.parse_args()
    found = 0
    for f in re.split(r"\n\s*Function : ", sass_of(a.cu)):
        name = f.split("\n", 1)[0]
        if a.pattern not in name:
            continue
        found += 1
        ins = [(int(m.group(1), 16), m.group(2)) for m in
               (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", l) for l in f.split("\n")) if m]
        print(f"{name}\n  {len(ins)} instructions")
        loops = []
        for addr, t in ins:
            m = re.search(r"BRA\s.*?(0x[0-9a-f]+)", t)
            if m and int(m.group(1), 16) < addr:
                lo = int(m.group(1), 16)
                loops.append([u for b, u in ins if lo <= b <= addr])
        for body in sorted(loops, key=len):
            mix = collections.Counter(opcode(u) for u in body)
            hmma = sum(v for k, v in mix.items() if k.startswith("HMMA"))
            top = ", ".join(f"{k} {v}" for k, v in mix.most_common(a.top))
            print(f"  loop of {len(body)} (HMMA {hmma}): {top}")
    if not found:
        print(f"no function name contains {a.pattern}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
