"""Per-layer and worst-head views of a `locks eval --per-query` run (docs/study_smollm2.md).

  python -m locks_lab.study EVAL_DIR NAME FIG_DIR   -> markdown on stdout, PNGs in FIG_DIR

Reads EVAL_DIR/per_query.csv (method,budget,layer,step,q_head,recall,rel_l2,cosine) with
numpy; plots with gnuplot (the harness's plotting tool)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

ORDER = ["oracle", "locks_fp32", "locks_quant", "quest", "shadowkv", "shared_proj", "rocket",
         "rocket_snapkv"]


def load(path):
    rows = np.genfromtxt(path, delimiter=",", names=True, dtype=None, encoding="utf-8")
    return rows


def per_layer(rows, budget, metric="recall"):
    layers = np.unique(rows["layer"])
    out = {}
    for m in ORDER:
        sel = (rows["method"] == m) & (rows["budget"] == budget)
        if not sel.any():
            continue
        out[m] = np.array([rows[metric][sel & (rows["layer"] == L)].mean() for L in layers])
    return layers, out


def worst_heads(rows, method, budget, k=5):
    sel = (rows["method"] == method) & (rows["budget"] == budget)
    r = rows[sel]
    keys = {}
    for L, h, rec, err in zip(r["layer"], r["q_head"], r["recall"], r["rel_l2"]):
        keys.setdefault((int(L), int(h)), []).append((rec, err))
    stats = sorted(((np.mean([a for a, _ in v]), np.min([a for a, _ in v]), np.mean([b for _, b in v]), key)
                    for key, v in keys.items()))
    return stats[:k]


def head_means(rows, method, budget):
    sel = (rows["method"] == method) & (rows["budget"] == budget)
    r = rows[sel]
    acc = {}
    for L, h, rec in zip(r["layer"], r["q_head"], r["recall"]):
        acc.setdefault((int(L), int(h)), []).append(rec)
    return {k: float(np.mean(v)) for k, v in acc.items()}


def worst_gaps(rows, method, budget, k=5):
    """The k heads where the method falls furthest below the oracle (mean recall over steps)."""
    o, m = head_means(rows, "oracle", budget), head_means(rows, method, budget)
    return sorted(((o[key] - m[key], o[key], m[key], key) for key in m), reverse=True)[:k]


def plot_layers(layers, curves, title, png):
    dat = png[:-4] + ".dat"
    ms = list(curves)
    with open(dat, "w") as f:
        for i, L in enumerate(layers):
            f.write(f"{L} " + " ".join(f"{curves[m][i]:.5f}" for m in ms) + "\n")
    plots = ", ".join(f"'{dat}' using 1:{j + 2} with linespoints title '{m}'" for j, m in enumerate(ms))
    script = (f"set terminal pngcairo size 900,500 noenhanced; set output '{png}'; set title '{title}'; "
              "set xlabel 'layer'; set ylabel 'mean attention-mass recall'; set key bottom right; "
              f"set yrange [0:1.02]; set grid; plot {plots}")
    subprocess.run(["gnuplot", "-e", script], check=True)
    os.remove(dat)


def main(argv=None):
    eval_dir, name, fig_dir = (argv or sys.argv[1:])[:3]
    rows = load(os.path.join(eval_dir, "per_query.csv"))
    os.makedirs(fig_dir, exist_ok=True)
    print(f"### Per layer ({name}): mean recall over 32 steps x 9 query heads\n")
    for budget in (128, 512):
        layers, curves = per_layer(rows, budget)
        plot_layers(layers, curves, f"SmolLM2-135M, {name}: recall per layer at b={budget}",
                    os.path.join(fig_dir, f"smollm2_{name}_layer_recall_b{budget}.png"))
        print(f"b = {budget}:\n")
        print("| layer | " + " | ".join(curves) + " |")
        print("|---|" + "---|" * len(curves))
        for i, L in enumerate(layers):
            print(f"| {L} | " + " | ".join(f"{curves[m][i]:.3f}" for m in curves) + " |")
        print()
    print(f"### Worst heads ({name}): the 5 (layer, query head) with the lowest mean recall\n")
    for budget in (128, 512):
        print(f"b = {budget}:\n")
        print("| method | worst heads: layer/head mean recall (min over steps; mean rel. L2) |")
        print("|---|---|")
        for m in ORDER:
            if not ((rows["method"] == m) & (rows["budget"] == budget)).any():
                continue
            ws = worst_heads(rows, m, budget)
            print(f"| {m} | " + "; ".join(f"L{k[0]}/h{k[1]} {a:.3f} ({mn:.3f}; {e:.3f})" for a, mn, e, k in ws) + " |")
        print()
    print(f"### Largest gaps to the oracle ({name}): the 5 heads where each selector loses most\n")
    for budget in (128, 512):
        print(f"b = {budget}:\n")
        print("| method | layer/head: oracle recall -> method recall |")
        print("|---|---|")
        for m in ORDER[1:]:
            if not ((rows["method"] == m) & (rows["budget"] == budget)).any():
                continue
            ws = worst_gaps(rows, m, budget)
            print(f"| {m} | " + "; ".join(f"L{k[0]}/h{k[1]} {o:.3f} -> {v:.3f}" for g, o, v, k in ws) + " |")
        print()


if __name__ == "__main__":
    main()
