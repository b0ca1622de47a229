"""Markdown table of `locks eval` results (results.csv of one or more runs on the same capture):
per method the metadata share of bf16 K+V, mean recall per budget, and the gap to the oracle's
mean recall averaged over the budgets >= 512 (the issue-11 target: <= 0.02).

    python -m locks_lab.lever_table EVAL_DIR [EVAL_DIR ...] [--label method=text ...]
"""
from __future__ import annotations

import csv
import os
import sys


def load(dirs):
    rows = {}
    order = []
    for d in dirs:
        with open(os.path.join(d, "results.csv")) as f:
            for r in csv.DictReader(f):
                m = r["method"]
                if m not in rows:
                    rows[m] = {}
                    order.append(m)
                rows[m][int(r["budget"])] = r
    return order, rows


def table(dirs, labels=None) -> str:
    labels = labels or {}
    order, rows = load(dirs)
    budgets = sorted({b for m in rows.values() for b in m})
    oracle = rows.get("oracle", {})
    big = [b for b in budgets if b >= 512]
    head = "| method | metadata | " + " | ".join(f"b={b}" for b in budgets) + " | gap b>=512 |"
    out = [head, "|---|---:|" + "---:|" * len(budgets) + "---:|"]
    for m in order:
        r = rows[m]
        meta = float(next(iter(r.values()))["metadata_share"])
        cells = [f"{float(r[b]['recall_mean']):.3f}" if b in r else "" for b in budgets]
        gap = ""
        if oracle and m != "oracle" and all(b in r and b in oracle for b in big):
            gap = f"{sum(float(oracle[b]['recall_mean']) - float(r[b]['recall_mean']) for b in big) / len(big):+.3f}"
        name = labels.get(m, m)
        out.append(f"| {name} | {meta * 100:.2f}% | " + " | ".join(cells) + f" | {gap} |")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    labels = {}
    if "--label" in argv:
        i = argv.index("--label")
        for kv in argv[i + 1:]:
            k, v = kv.split("=", 1)
            labels[k] = v
        argv = argv[:i]
    print(table(argv, labels))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
