"""The super build's stopping rule against int4 (a numpy restatement of src/cuda/super_build.cu's
subspace iteration: 16 columns from the kernel's hash start, modified Gram-Schmidt each
iteration, stop when trace(X^T C X) changes by <= tol relative after >= 4 iterations, at most
max; Rayleigh-Ritz; the top 8 Ritz vectors). Per group of S 32 pages (512 keys): iterations,
the top-8 variance the fp32 basis misses against the exact eigenvectors, and what the basis
misses once its rows are int4-quantized as the super summary stores them (scale = max |w| / 7
a row) -- the number that reaches level 1.

Usage: python study.py CAPTURE/layer5_k.npy ... [random]
       python study.py --warm CAPTURE/layer5_k.npy ...  (the first 8 start columns = the
       previous group's top-8 basis, what a decode-time build could reuse: iterations at 1e-4)
(the Gemma-3-270M capture: python -m locks_lab.capture_hybrid --source info --tokens 32752
--steps 16 --out cap_g_info32k, docs/study_gemma3.md; `random` = i.i.d. normal keys, d 128,
the bench's worst case)."""
import sys

import numpy as np

M, R, S, P = 16, 8, 32, 16
RULES = [(1e-4, 48), (1e-3, 48), (1e-3, 24), (1e-4, 16), (1e-3, 12)]


def hash_start(d):
    """start_value(j, c) of super_build.cu."""
    j = np.arange(d, dtype=np.uint64)[:, None]
    c = np.arange(M, dtype=np.uint64)[None, :]
    m = np.uint64(0xFFFFFFFF)
    h = ((j * np.uint64(0x9E3779B1)) & m) ^ ((c * np.uint64(0x85EBCA77)) & m)
    h ^= h >> np.uint64(15)
    h = (h * np.uint64(0x2C1B3C6D)) & m
    h ^= h >> np.uint64(12)
    return ((h >> np.uint64(8)).astype(np.float64) / 8388608.0 - 1.0).astype(np.float32)


def mgs(X):
    X = X.copy()
    nmax = 0.0
    for c in range(M):
        n = float(X[:, c] @ X[:, c])
        nmax = max(nmax, n)
        if n <= 0 or n <= 1e-10 * nmax:
            X[:, c] = 0
            continue
        X[:, c] /= np.sqrt(n)
        X[:, c + 1:] -= np.outer(X[:, c], X[:, c] @ X[:, c + 1:])
    return X


def build(C, tol, maxi, mini=4, start=None):
    X = mgs(hash_start(C.shape[0]) if start is None else start)
    prev = -1.0
    for it in range(maxi):
        Y = C @ X
        tr = float(np.sum(X * Y))
        X = mgs(Y)
        if it + 1 >= mini and tr - prev <= tol * tr:
            break
        prev = tr
    X = mgs(X)
    T = X.T @ C @ X
    _, U = np.linalg.eigh((T + T.T) / 2)
    return it + 1, X @ U[:, ::-1][:, :R]


def int4_capture(W, C):
    Q = []
    for k in range(W.shape[1]):
        w = W[:, k] / np.linalg.norm(W[:, k])
        s = np.abs(w).max() / 7
        Q.append(np.clip(np.round(w / s), -7, 7) * s)
    O, _ = np.linalg.qr(np.array(Q).T)
    return float(np.trace(O.T @ C @ O))


def main(path):
    if path == "random":
        k = np.random.default_rng(0).standard_normal((32768, 128)).astype(np.float32)
    else:
        k = np.load(path)[:, 0, :].astype(np.float32)
    G = min(k.shape[0] // (S * P), 63)
    out, q4 = {r: [] for r in RULES}, []
    for g in range(G):
        keys = k[g * S * P:(g + 1) * S * P]
        D = keys - keys.mean(0)
        C = (D.T @ D / len(keys)).astype(np.float32)
        ev, V = np.linalg.eigh(C.astype(np.float64))
        best = ev[::-1][:R].sum()
        q4.append((best - int4_capture(V[:, ::-1][:, :R], C)) / best)
        for r in RULES:
            n, W = build(C, *r)
            cap = float(np.trace(W.T @ C @ W))
            out[r].append((n, (best - cap) / best, (best - int4_capture(W, C)) / best))
    print(f"{path}: d {k.shape[1]}, {G} groups; the exact basis int4-quantized misses max {max(q4):.2e} "
          f"mean {np.mean(q4):.2e} of the top-8 variance")
    for r, v in out.items():
        a = np.array(v)
        print(f"  tol {r[0]:.0e} cap {r[1]:2d}: iterations mean {a[:, 0].mean():5.1f} max {a[:, 0].max():3.0f}; "
              f"missed fp32 max {a[:, 1].max():.1e}; after int4 max {a[:, 2].max():.2e} mean {a[:, 2].mean():.2e}")


def warm(path):
    k = np.load(path)[:, 0, :].astype(np.float32)
    G = min(k.shape[0] // (S * P), 63)
    rows, prev = [], None
    for g in range(G):
        keys = k[g * S * P:(g + 1) * S * P]
        D = keys - keys.mean(0)
        C = (D.T @ D / len(keys)).astype(np.float32)
        n_cold, W = build(C, 1e-4, 48)
        if prev is not None:
            X0 = hash_start(C.shape[0])
            X0[:, :R] = prev
            rows.append((n_cold, build(C, 1e-4, 48, start=X0)[0]))
        prev = W
    a = np.array(rows)
    print(f"{path} (warm start, tol 1e-4): cold iterations mean {a[:, 0].mean():.1f} max {a[:, 0].max():.0f}; "
          f"warm mean {a[:, 1].mean():.1f} max {a[:, 1].max():.0f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    for p in args[1:] if args[:1] == ["--warm"] else args:
        (warm if args[:1] == ["--warm"] else main)(p)
