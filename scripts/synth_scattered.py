#!/usr/bin/env python3
"""Writes a capture (docs/capture_format.md) whose relevance is scattered: the adversarial case
of two-level LOCKS (docs/study_hierarchical.md). Every page has its own random rank-4 subspace
(as `locks synth --kind local_lowrank`); `--relevant` pages, one in each of as many distinct
groups of `--group` pages, get their centroid shifted along the KV head's query direction by a
strength drawn uniformly from [--lo, --hi] (graded: the mass is spread over all of them, so a
budget of k pages needs k of those groups). numpy only; deterministic for a seed.

usage: scripts/synth_scattered.py --out DIR [--tokens 32768] [--relevant 64] [--group 32]
"""
import argparse
import json
import os

import numpy as np


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--q-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--relevant", type=int, default=64)
    ap.add_argument("--group", type=int, default=32, help="pages per group the relevant pages avoid sharing")
    ap.add_argument("--lo", type=float, default=2.5)
    ap.add_argument("--hi", type=float, default=3.5)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    P, H, d, T = 16, a.kv_heads, a.head_dim, a.tokens
    if T % P or a.q_heads % H:
        raise SystemExit("tokens must be a multiple of 16 and q_heads of kv_heads")
    pages = T // P
    groups = pages // a.group
    if a.relevant > groups:
        raise SystemExit(f"--relevant {a.relevant} > {groups} groups of {a.group} pages")
    rng = np.random.default_rng(a.seed)
    u = rng.standard_normal((H, d))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    k = np.empty((pages, P, H, d), np.float32)
    for h in range(H):
        basis = rng.standard_normal((pages, 4, d)) / np.sqrt(d)       # per-page subspace
        coef = rng.standard_normal((pages, P, 4)) * np.array([3.0, 1.5, 1.0, 0.75])
        centre = 0.5 * rng.standard_normal((pages, 1, d))
        k[:, :, h, :] = centre + np.einsum("pir,prd->pid", coef, basis) + 0.1 * rng.standard_normal((pages, P, d))
    chosen = rng.choice(groups, a.relevant, replace=False)
    rel = np.sort(chosen * a.group + rng.integers(0, a.group, a.relevant))
    strength = rng.uniform(a.lo, a.hi, a.relevant)
    for h in range(H):
        k[rel, :, h, :] += strength[:, None, None] * u[h][None, None, :]
    k = k.reshape(T, H, d)
    v = rng.standard_normal((T, H, d)).astype(np.float32)
    G = a.q_heads // H
    q = np.empty((a.steps, a.q_heads, d), np.float32)
    for h in range(a.q_heads):
        q[:, h, :] = np.sqrt(d) * u[h // G] + 0.5 * rng.standard_normal((a.steps, d))
    os.makedirs(a.out, exist_ok=True)
    np.save(os.path.join(a.out, "layer0_k.npy"), k.astype(np.float32))
    np.save(os.path.join(a.out, "layer0_v.npy"), v)
    np.save(os.path.join(a.out, "layer0_q.npy"), q)
    meta = {"model": "synthetic/scattered", "num_layers": 1, "layers": [0], "kv_heads": H,
            "q_heads": a.q_heads, "head_dim": d, "positional_encoding": "none",
            "keys": "post_rope", "tokens": T, "steps": a.steps, "dtype": "float32",
            "synthetic": {"kind": "scattered", "relevant_pages": [int(x) for x in rel],
                          "group": a.group, "seed": a.seed}}
    with open(os.path.join(a.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    print(f"wrote {a.out}: {a.relevant} relevant pages in distinct groups of {a.group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
