# Warp emulation of super_score's page mma (the new pass), mirroring the kernel's indexing.
import numpy as np
rng = np.random.default_rng(1)

def f16(x): return np.float64(np.float16(x))
def split(x):  # split_half2 per value
    hi = f16(x); lo = f16(x - hi); return hi, lo
def pow2_normaliser(mx):
    if mx == 0: return 1.0
    e = int(np.floor(np.log2(mx)))
    if e <= -126 or e >= 127: return 1.0
    return 2.0 ** (-e)

# mma m16n8k16 from per-lane fragments (PTX layout)
def mma(afr, bfr):
    A = np.zeros((16, 16)); B = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a0, a1, a2, a3 = afr[lane]; b0, b1 = bfr[lane]
        A[g, 2*t:2*t+2] = a0; A[g+8, 2*t:2*t+2] = a1; A[g, 2*t+8:2*t+10] = a2; A[g+8, 2*t+8:2*t+10] = a3
        B[2*t:2*t+2, g] = b0; B[2*t+8:2*t+10, g] = b1
    D = A @ B
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append((D[g, 2*t], D[g, 2*t+1], D[g+8, 2*t], D[g+8, 2*t+1]))
    return out

def run(R, RM, S, MODE, nheads=4):
    MT = RM // 8; PL = 1 if S <= 32 else 2; ROWS = 4 * PL; NMT = 2 * PL
    w = rng.normal(size=(nheads, R)) * rng.uniform(0.1, 10)
    esc = rng.uniform(0.01, 0.1, R); csc = rng.uniform(0.01, 0.1, R)
    hi = rng.integers(-127, 128, (S, R)); lo = rng.integers(-127, 128, (S, R))
    sw = rng.random((S, R)) < 0.8
    hi, lo = np.where(sw, np.maximum(hi, lo), np.minimum(hi, lo)), np.where(sw, np.minimum(hi, lo), np.maximum(hi, lo))
    co = rng.integers(-127, 128, (S, R))
    # reference (cpu::super_score's page term)
    ref = np.zeros((nheads, S)); refc = np.zeros((nheads, S))
    for h in range(nheads):
        for p in range(S):
            ref[h, p] = sum(max(w[h, k]*esc[k]*hi[p, k], w[h, k]*esc[k]*lo[p, k]) for k in range(R)) if MODE else sum(w[h,k]*csc[k]*co[p,k] for k in range(R))
            refc[h, p] = sum(w[h, k]*csc[k]*co[p, k] for k in range(R))
    # lanes after W q: wx[t] of head tig, rank gid + 8t
    wx = {}; wcx = {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for tt in range(MT):
            k = g + 8*tt
            ww = w[t, k] if k < R else 0.0
            wx[lane, tt] = ww * (csc[k] if MODE == 0 else esc[k]) if k < R else 0.0
            wcx[lane, tt] = ww * csc[k] if k < R else 0.0
    # page codes: pc[r][s] (pairs of ranks 8s+2tig,+1 of page gid+8r)
    def code(arr, p, k): return arr[p, k] if (p < S and k < R) else 0
    # B build
    vx = {}; vc = {}; mxx = {}; mxc = {}
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        src0 = 4*(2*t) + (g >> 1); src1 = src0 + 4
        m = 0.0; mc = 0.0
        for s in range(MT):
            vx[lane, s] = (wx[src0, s], wx[src1, s]); m = max(m, abs(vx[lane, s][0]), abs(vx[lane, s][1]))
            vc[lane, s] = (wcx[src0, s], wcx[src1, s]); mc = max(mc, abs(vc[lane, s][0]), abs(vc[lane, s][1]))
        mxx[lane] = m; mxc[lane] = mc
    fx = {}; fc = {}
    for lane in range(32):
        m = max(mxx[lane ^ x] for x in (0, 1, 2, 3)); mc = max(mxc[lane ^ x] for x in (0, 1, 2, 3))
        fx[lane] = pow2_normaliser(m); fc[lane] = pow2_normaliser(mc)
    bx0 = {}; bx1 = {}; bc0 = {}
    for lane in range(32):
        g = lane >> 2; lo_col = g & 1
        for s in range(MT):
            hx = fx[lane] if MODE == 0 else 0.5 * fx[lane]
            part = lambda x0, x1: tuple(split(x)[lo_col] for x in (x0, x1))
            bx0[lane, s] = part(vx[lane, s][0]*hx, vx[lane, s][1]*hx)
            bx1[lane, s] = (0.0, 0.0) if MODE == 0 else part(abs(vx[lane, s][0])*hx, abs(vx[lane, s][1])*hx)
            bc0[lane, s] = part(vc[lane, s][0]*fc[lane], vc[lane, s][1]*fc[lane])
    unx = {lane: 1.0 / fx[8*(lane & 3)] for lane in range(32)}
    unc = {lane: 1.0 / fc[8*(lane & 3)] for lane in range(32)}
    def frag(lane, r, s):
        g, t = lane >> 2, lane & 3; p = g + 8*r; k0 = 8*s + 2*t
        if MODE == 0:
            return (code(co, p, k0), code(co, p, k0+1)), (0, 0), (0, 0)
        H = np.array([code(hi, p, k0), code(hi, p, k0+1)]); L = np.array([code(lo, p, k0), code(lo, p, k0+1)])
        return tuple(H + L), tuple(np.abs(H - L)), (code(co, p, k0), code(co, p, k0+1))
    est = {}
    for mt in range(NMT):
        if 16*mt >= S: continue
        dx = [np.zeros(4) for _ in range(32)]; dc = [np.zeros(4) for _ in range(32)]
        for s in range(MT):
            afr = []; bfr = []; afc = []; bfc = []
            for lane in range(32):
                f0 = frag(lane, 2*mt, s); f1 = frag(lane, 2*mt+1, s)
                afr.append((f0[0], f1[0], f0[1], f1[1])); bfr.append((bx0[lane, s], bx1[lane, s]))
                afc.append((f0[2], f1[2], (0, 0), (0, 0))); bfc.append((bc0[lane, s], (0, 0)))
            out = mma(afr, bfr); outc = mma(afc, bfc)
            for lane in range(32): dx[lane] += out[lane]; dc[lane] += outc[lane]
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for x in range(2):
                r = 2*mt + x; p = g + 8*r
                if p < S:
                    est[t, p] = ((dx[lane][2*x] + dx[lane][2*x+1]) * unx[lane], (dc[lane][2*x] + dc[lane][2*x+1]) * unc[lane])
    err = 0.0; errc = 0.0
    for h in range(nheads):
        for p in range(S):
            e, c = est[h, p]
            err = max(err, abs(e - ref[h, p]) / (np.abs(w[h] * esc).sum() * 127 + 1e-30))
            if MODE == 2: errc = max(errc, abs(c - refc[h, p]) / (np.abs(w[h] * csc).sum() * 127))
    assert len(est) == nheads * S
    return err, errc

for (R, RM, S, MODE) in [(8, 8, 32, 1), (8, 8, 32, 0), (8, 8, 32, 2), (5, 8, 64, 1), (12, 16, 64, 2), (16, 16, 8, 1), (3, 8, 16, 0), (8, 8, 2, 1), (16, 16, 33, 0)]:
    err, errc = run(R, RM, S, MODE)
    print(f"R {R} RM {RM} S {S} MODE {MODE}: max rel err {err:.2e} cen {errc:.2e}", "OK" if err < 1e-6 and errc < 1e-6 else "FAIL")
