#!/usr/bin/env python3
"""Instruction mix of a kernel's loops, from SASS (no GPU needed).

  scripts/sass_loops.py FILE.cu PATTERN [--top N] [--nested]

Compiles FILE.cu for sm_90a to a cubin (nvcc, this repository's include paths), disassembles it
with cuobjdump, and for every function whose mangled name contains PATTERN prints its
instruction count, then each loop (a backward branch and the code it jumps back over,
innermost first) with its length, its HMMA count and its opcodes by count. The innermost loop
holding HMMA instructions is the stage loop of the tensor-core kernels (score_mma: one stage of
4 pages a warp; super_score: one pass of 4 query heads). Static counts: a loop's dynamic
instructions differ by the branches it skips (rare paths, e.g. score_mma's max-shifted
log-sum-exp, count here but seldom run). --nested prints only the innermost loop holding HMMA
and the innermost loop around it (super_score: one pass and one group), not counting the
divergent-shuffle fallbacks (BRA.DIV branches and the copies they reach) as loops.

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


def loop_ranges(ins, skip_divergent: bool = False) -> list[tuple[int, int]]:
    """(start, end) addresses of every loop: a branch back to an earlier address. skip_divergent:
    not the BRA.DIV branches to the divergent-shuffle fallbacks."""
    ranges = []
    for addr, t in ins:
        m = re.search(r"BRA\s.*?(0x[0-9a-f]+)", t)
        if m and int(m.group(1), 16) < addr and not (skip_divergent and "BRA.DIV" in t):
            ranges.append((int(m.group(1), 16), addr))
    return ranges


def print_nested(ins, top: int) -> None:
    ranges = loop_ranges(ins, skip_divergent=True)
    body = lambda r: [u for b, u in ins if r[0] <= b <= r[1]]
    # The divergent-shuffle fallbacks are out-of-line copies holding WARPSYNC.COLLECTIVE.
    hmma = [r for r in ranges if any(opcode(u).startswith("HMMA") for u in body(r))
            and not any(opcode(u) == "WARPSYNC.COLLECTIVE" for u in body(r))]
    if not hmma:
        print("  no loop holds HMMA")
        return
    inner = min(hmma, key=lambda r: r[1] - r[0])
    around = [r for r in ranges if r != inner and r[0] <= inner[0] and r[1] >= inner[1]]
    for label, r in [("inner", inner)] + ([("around", min(around, key=lambda r: r[1] - r[0]))]
                                          if around else []):
        mix = collections.Counter(opcode(u) for u in body(r))
        hm = sum(v for k, v in mix.items() if k.startswith("HMMA"))
        print(f"  {label} loop of {len(body(r))} (HMMA {hm}): " +
              ", ".join(f"{k} {v}" for k, v in mix.most_common(top)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cu")
    ap.add_argument("pattern")
    ap.add_argument("--top", type=int, default=25, help="opcodes shown a loop")
    ap.add_argument("--nested", action="store_true",
                    help="only the innermost HMMA loop and the loop around it")
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
        if a.nested:
            print_nested(ins, a.top)
            continue
        loops = [[u for b, u in ins if lo <= b <= hi] for lo, hi in loop_ranges(ins)]
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
