#!/usr/bin/env python3
"""Print the A/B logs of `scripts/gpu_tests.sh ab` as one line per bench row.

    python3 scripts/ab_table.py gpu-out/ab.log [more logs]

Each line: the side (base / new; logs written before 54e476d have none), the binary, the row,
the extra bench options, then the LOCKS step (ms), its ratio to dense, and the stage times (ms)
of the row the bench printed. Two-level rows (`--two-level`: "model context batch budget |")
print the budget, the two-level step, its ratio to dense and its five stages. A binary that
aborted prints its error instead.
"""
import re
import sys

ROW = re.compile(r"^[A-Z][A-Za-z0-9.-]+ +\d+ +\d+ \|")
TWO_LEVEL_ROW = re.compile(r"^[A-Z][A-Za-z0-9.-]+ +\d+ +\d+ +(\d+) \|")


def main(paths):
    for path in paths:
        print("##", path)
        head = None
        for line in open(path):
            if line.startswith("== rep"):
                f = line.split()[3:]
                side = f.pop(0) if f and f[0] in ("base", "new") else "-"
                head = (side, f[0], " ".join(f[1:4]), " ".join(f[4:]))
            elif TWO_LEVEL_ROW.match(line) and head:
                budget = TWO_LEVEL_ROW.match(line).group(1)
                parts = line.split("|")
                ms, ratio, st = parts[1].split(), parts[2].split(), parts[3].split()
                print(f"{head[0]:4} {head[1]:24} {head[2]:22} {head[3]:18} b {budget:>5} two {ms[2]} "
                      f"x{ratio[1]} | lvl1 {st[0]} choice {st[1]} lvl2 {st[2]} aggsel {st[3]} "
                      f"attn {st[4]}")
            elif ROW.match(line) and head:
                parts = line.split("|")
                lk, st = parts[1].split(), parts[2].split()
                print(f"{head[0]:4} {head[1]:24} {head[2]:22} {head[3]:18} locks {lk[1]} x{lk[2]} | "
                      f"score {st[0]} agg {st[1]} sel {st[2]} attn {st[3]} launch {st[4]}")
            elif "what()" in line or line.startswith("timeout: "):
                # an exception's message, or a binary that did not start (`timeout: failed to
                # run command ...`: a missing build), so that a row never vanishes silently
                print("     error:", line.strip()[:120])


if __name__ == "__main__":
    main(sys.argv[1:])
