"""The joined table: the bench's dense and LOCKS times beside FA3's, per row; CSV and JSON."""
from __future__ import annotations

import csv
import json
import math

from .grid import BenchRow, Row, sizes

COLUMNS = ["model", "context", "batch", "dense_ms", "fa3_free_ms", "fa3_cap32_ms", "locks_ms",
           "locks_vs_dense", "locks_vs_fa3_cap32", "locks_vs_fa3_free", "fa3_cap32_vs_dense",
           "dense_pct", "fa3_free_pct", "fa3_cap32_pct", "kv_GB", "fa3_check", "note"]


def _ratio(a, b):
    return a / b if a is not None and b else None


def _pct_of_ceiling(nbytes: float, ms, ceiling: float | None):
    if ms is None or not ceiling:
        return None
    return 100.0 * nbytes / (ms * 1e-3) / 1e12 / ceiling


def join(bench_rows: list[BenchRow], fa3: dict[tuple, dict], ceiling: float | None,
         rows: list[Row] | None = None) -> list[dict]:
    """One dict per row, in the bench's order (or `rows`' order when given).

    Ratios are times, larger = LOCKS faster: locks_vs_X = X_ms / locks_ms; fa3_cap32_vs_dense
    = dense_ms / fa3_cap32_ms (above 1: FA3 faster than our dense kernel). *_pct: bytes a dense
    step reads (all of K and V) / time, against the read ceiling."""
    by_key = {b.row.key: b for b in bench_rows}
    order = rows if rows is not None else [b.row for b in bench_rows]
    out = []
    for r in order:
        b = by_key.get(r.key)
        f = fa3.get(r.key, {"status": "not run", "reason": "no FA3 result"})
        s = sizes(r)
        dense = b.fields.get("dense_ms") if b and not b.skipped else None
        locks = b.fields.get("locks_ms") if b and not b.skipped else None
        free, cap = f.get("fa3_free_ms"), f.get("fa3_cap32_ms")
        notes = []
        if b is None:
            notes.append("bench: no row")
        elif b.skipped:
            notes.append(f"bench skipped: {b.skipped}")
        if f.get("status") != "ok":
            notes.append(f"FA3 {f.get('status')}: {f.get('reason', '')}".rstrip(": "))
        check = None
        if f.get("status") == "ok":
            oks = [f.get("fa3_free_ok"), f.get("fa3_cap32_ok")]
            check = "ok" if all(oks) else "FAILED"
            if check == "FAILED":
                notes.append(f"FA3 output check failed (max err free {f.get('fa3_free_err')}, "
                             f"cap32 {f.get('fa3_cap32_err')})")
        out.append({
            "model": r.model, "context": r.context, "batch": r.batch,
            "dense_ms": dense, "fa3_free_ms": free, "fa3_cap32_ms": cap, "locks_ms": locks,
            "locks_vs_dense": _ratio(dense, locks), "locks_vs_fa3_cap32": _ratio(cap, locks),
            "locks_vs_fa3_free": _ratio(free, locks), "fa3_cap32_vs_dense": _ratio(dense, cap),
            "dense_pct": _pct_of_ceiling(s.kv_bytes, dense, ceiling),
            "fa3_free_pct": _pct_of_ceiling(s.kv_bytes, free, ceiling),
            "fa3_cap32_pct": _pct_of_ceiling(s.kv_bytes, cap, ceiling),
            "kv_GB": s.kv_bytes / 1e9, "fa3_check": check, "note": "; ".join(notes),
        })
    return out


def _cell(v, fmt: str) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-".rjust(int(fmt.split(".")[0]))
    return format(v, fmt)


def format_table(joined: list[dict], ceiling: float | None, ceiling_source: str) -> str:
    head = (f"{'model':<19} {'context':>8} {'batch':>5} | {'dense_ms':>9} {'fa3_ms':>9} "
            f"{'fa3_32ms':>9} {'locks_ms':>9} | {'xdense':>6} {'xfa3_32':>7} {'xfa3':>6} "
            f"{'fa3/dn':>6} | {'dense%':>6} {'fa3%':>6} {'fa3_32%':>7} | check")
    lines = [head]
    for j in joined:
        lines.append(
            f"{j['model']:<19} {j['context']:>8} {j['batch']:>5} | "
            f"{_cell(j['dense_ms'], '9.4f')} {_cell(j['fa3_free_ms'], '9.4f')} "
            f"{_cell(j['fa3_cap32_ms'], '9.4f')} {_cell(j['locks_ms'], '9.4f')} | "
            f"{_cell(j['locks_vs_dense'], '6.2f')} {_cell(j['locks_vs_fa3_cap32'], '7.2f')} "
            f"{_cell(j['locks_vs_fa3_free'], '6.2f')} {_cell(j['fa3_cap32_vs_dense'], '6.2f')} | "
            f"{_cell(j['dense_pct'], '6.1f')} {_cell(j['fa3_free_pct'], '6.1f')} "
            f"{_cell(j['fa3_cap32_pct'], '7.1f')} | {j['fa3_check'] or '-'}"
            + (f"  ({j['note']})" if j["note"] else ""))
    c = f"{ceiling:.2f} TB/s, {ceiling_source}" if ceiling else "unknown"
    lines.append(
        "\nfa3_ms = FA3 with its own split heuristic (vLLM eager / piecewise); fa3_32ms = FA3 "
        "with vLLM's full-graph cap of 32 splits (the serving configuration); xdense, xfa3_32, "
        "xfa3 = that time / locks_ms (above 1: LOCKS faster); fa3/dn = dense_ms / fa3_32ms "
        f"(above 1: FA3 faster than our dense kernel); % = K+V bytes / time / read ceiling ({c}); "
        "check = FA3's output vs an fp32 reference on the first and last sequence")
    return "\n".join(lines)


def write_csv(path: str, joined: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for j in joined:
            w.writerow({k: ("" if j[k] is None else
                            (f"{j[k]:.5g}" if isinstance(j[k], float) else j[k])) for k in COLUMNS})


def write_json(path: str, meta: dict, joined: list[dict], fa3_raw: dict[tuple, dict]) -> None:
    raw = [{"model": k[0], "context": k[1], "batch": k[2], **v} for k, v in fa3_raw.items()]
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": joined, "fa3_raw": raw}, f, indent=1)
        f.write("\n")
