"""The adaptive budget against fixed budgets at equal mean attended tokens (docs/study_adaptive.md).

    python -m locks_lab.adaptive_study FIXED_DIR TAU_DIR [TAU_DIR ...]
    python -m locks_lab.adaptive_study --per-layer TAU_DIR METHOD CEILING
    python -m locks_lab.adaptive_study --bracket TAU_DIR [TAU_DIR ...]   # budgets for FIXED_DIR

FIXED_DIR: a `locks eval` output over a ladder of fixed budgets; each TAU_DIR: the same capture
and methods with `--tau T` (its budgets are ceilings). For every (method, ceiling) of a TAU_DIR
the adaptive run's mean attended tokens and recall / relative L2 error are set against the fixed
ladder's, interpolated linearly in log2(attended tokens) between the two fixed budgets around
it (no extrapolation: outside the ladder the row says so). Prints markdown tables. Reads only
results.json (stdlib only, so it runs without torch).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def load(d: str) -> dict:
    return json.loads((Path(d) / "results.json").read_text())


def interpolate(ladder: list[tuple[float, float]], x: float) -> float | None:
    """ladder: (attended, value) sorted by attended; value at x, linear in log2(attended)."""
    for (x0, y0), (x1, y1) in zip(ladder, ladder[1:]):
        if x0 <= x <= x1:
            if x1 == x0:
                return y0
            t = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
            return y0 + t * (y1 - y0)
    return None


def ladder(fixed: dict, method: str, metric: str) -> list[tuple[float, float]]:
    rows = sorted((r["attended_mean"], r[metric]) for r in fixed["results"] if r["method"] == method)
    return rows


def fmt(x: float | None, digits: int = 4) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def compare(fixed_dir: str, tau_dirs: list[str]) -> str:
    fixed = load(fixed_dir)
    out = ["| method | tau | ceiling | attended (mean tokens) | recall adaptive | recall fixed, same tokens "
           "| gain | recall p5 adaptive / fixed | rel. L2 adaptive / fixed |",
           "|---|---|---|---|---|---|---|---|---|"]
    for d in tau_dirs:
        run = load(d)
        tau = run["config"]["tau"]
        for r in run["results"]:
            m, att = r["method"], r["attended_mean"]
            rec = interpolate(ladder(fixed, m, "recall_mean"), att)
            err = interpolate(ladder(fixed, m, "err_mean"), att)
            p5 = interpolate(ladder(fixed, m, "recall_p5"), att)
            gain = None if rec is None else r["recall_mean"] - rec
            out.append(f"| {m} | {tau:g} | {r['budget']} | {att:.0f} | {fmt(r['recall_mean'])} | {fmt(rec)} "
                       f"| {'n/a' if gain is None else f'{gain:+.4f}'} | {fmt(r['recall_p5'], 3)} / {fmt(p5, 3)} "
                       f"| {fmt(r['err_mean'])} / {fmt(err)} |")
    return "\n".join(out)


def per_layer(tau_dir: str, method: str, budget: int) -> str:
    """Tokens attended and recall per layer of one adaptive run (results.json's per_layer)."""
    run = load(tau_dir)
    rows = [r for r in run.get("per_layer", []) if r["method"] == method and r["budget"] == budget]
    out = [f"| layer | attended (mean tokens, ceiling {budget}) | recall |", "|---|---|---|"]
    out += [f"| {r['layer']} | {r['attended_mean']:.0f} | {r['recall_mean']:.4f} |"
            for r in sorted(rows, key=lambda r: r["layer"])]
    return "\n".join(out)


def bracket(tau_dirs: list[str], page_size: int = 16) -> str:
    """Fixed budgets for the comparison: 16, 32, ..., 4096 plus the multiples of page_size
    just below and above every adaptive run's mean attended tokens, comma-separated."""
    out = {16 << i for i in range(9)}
    for d in tau_dirs:
        for r in load(d)["results"]:
            lo = max(page_size, int(r["attended_mean"] // page_size) * page_size)
            out |= {lo, lo + page_size}
    return ",".join(str(b) for b in sorted(out))


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "--per-layer":
        print(per_layer(argv[1], argv[2], int(argv[3])))
        return 0
    if len(argv) >= 2 and argv[0] == "--bracket":
        print(bracket(argv[1:]))
        return 0
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    print(compare(argv[0], argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
