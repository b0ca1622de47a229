"""bench/peer_fa3.py: LOCKS vs vLLM's FA3 paged decode, per row of the kernel bench's grid.

  python3 bench/peer_fa3.py [--bench BIN | --bench-csv CSV [--bench-log LOG]] [--quick]
                            [--rows "MODEL CONTEXT BATCH;..."] [--out DIR] [--dry-run] ...

One invocation, one device: first the C++ bench (locks_bench_cuda: our dense kernel and the LOCKS
step, every stage; whole grid, --quick grid, or --only per --rows row) in a subprocess that
exits before FA3 touches the GPU, then FA3 on the same rows in a worker process (worker.py) whose
rows are each bounded by --row-timeout (a hung or crashed row is recorded, the worker restarted
on the rest), the whole under --budget-s. Writes DIR/bench.csv, bench.log, peer_fa3.{csv,json},
fa3_worker.log and prints the joined table (report.py).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from . import fa3_call, grid, report

ENTRY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "peer_fa3.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_BENCH = (".devcarry/gpu/bench/cuda/locks_bench_cuda", "build-cuda/bench/cuda/locks_bench_cuda")


class Lines:
    """Lines of a child's stdout with a deadline the caller moves (select + os.read: a blocking
    readline could not time out)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.fd, self.buf = proc, proc.stdout.fileno(), b""
        self.deadline = time.time()

    def next(self) -> str | None | bool:
        """The next line; None when the deadline passed; False at end of output."""
        while b"\n" not in self.buf:
            left = self.deadline - time.time()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
            if not r:
                continue
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                if self.buf:
                    line, self.buf = self.buf, b""
                    return line.decode(errors="replace")
                return False
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode(errors="replace")


def spawn(cmd: list[str], env=None, stdin=None) -> subprocess.Popen:
    # Own process group, so that a timeout ends the child and whatever it started, and nothing else.
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def run_logged(cmd: list[str], log, timeout: float, env=None, echo=True) -> int:
    """Runs cmd, its output to log (and stdout); returns rc, or 124 after the timeout."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = spawn(cmd, env=env)
    lines = Lines(proc)
    lines.deadline = time.time() + timeout
    while True:
        line = lines.next()
        if line is None:
            kill(proc)
            log.write(f"[peer] timed out after {timeout:.0f} s\n")
            return 124
        if line is False:
            return proc.wait()
        log.write(line + "\n")
        if echo:
            print(line, flush=True)


def bench_env(binary: str) -> dict:
    # What scripts/gpu_tests.sh puts on the library path for the carried binaries.
    env = dict(os.environ)
    extra = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib",
             os.path.join(os.path.dirname(binary), "..", "..", "runtime-libs")]
    env["LD_LIBRARY_PATH"] = ":".join([p for p in [env.get("LD_LIBRARY_PATH", "")] if p] + extra)
    return env


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def run_bench(args, rows: list[grid.Row] | None, deadline: float) -> dict:
    """The C++ bench on the grid (or on --rows, one --only run each); its rows and ceiling."""
    binary = args.bench
    csv_path = os.path.join(args.out, "bench.csv")
    log_path = os.path.join(args.out, "bench.log")
    info = {"binary": binary, "sha256": sha256(binary), "commands": [], "rc": []}
    env = bench_env(binary)
    csv_text, log_text = "", ""
    with open(log_path, "w") as log:
        cmds = ([[binary, csv_path] + (["--quick"] if args.quick else [])] if rows is None else
                [[binary, f"{csv_path}.{i}", "--only", r.model, str(r.context), str(r.batch)]
                 for i, r in enumerate(rows)])
        for cmd in cmds:
            left = min(args.bench_timeout, deadline - time.time())
            if left <= 5:
                log.write(f"[peer] not run (time budget): {' '.join(cmd)}\n")
                info["rc"].append("not run: time budget")
                continue
            info["commands"].append(" ".join(cmd[:1] + ["CSV"] + cmd[2:]))
            info["rc"].append(run_logged(cmd, log, left, env=env))
            if os.path.exists(cmd[1]):
                with open(cmd[1]) as f:
                    csv_text += f.read()
                if cmd[1] != csv_path:
                    os.remove(cmd[1])
    with open(log_path) as f:
        log_text = f.read()
    if rows is not None:  # one CSV for the whole run, like a grid run's
        with open(csv_path, "w") as f:
            f.write(csv_text)
    info["rows"] = grid.merge_bench_rows(grid.parse_bench_csv(csv_text),
                                         grid.parse_bench_stdout(log_text))
    info["ceiling"] = grid.parse_ceiling(log_text)
    return info


def run_fa3(rows: list[grid.Row], opts: dict, args, deadline: float, log) -> tuple[dict, dict]:
    """FA3 on every row in worker processes; {row key: result}, the worker's READY info."""
    results: dict[int, dict] = {}
    pending = list(range(len(rows)))
    ready_info: dict = {}
    restarts = 0
    while pending:
        if time.time() >= deadline - 5:
            break
        job = json.dumps({"rows": [list(rows[i].key) for i in pending], "opts": opts})
        proc = spawn([sys.executable, ENTRY, "--worker"], stdin=subprocess.PIPE)
        proc.stdin.write(job.encode())
        proc.stdin.close()
        lines = Lines(proc)
        lines.deadline = min(deadline, time.time() + args.ready_timeout)
        current, ready, fatal = None, False, None
        while True:
            line = lines.next()
            if line is None:  # a deadline passed: kill the worker, blame the row it was on
                kill(proc)
                over = time.time() >= deadline
                if not ready:
                    fatal = ("time budget spent before the worker was ready" if over else
                             f"worker not ready after {args.ready_timeout:.0f} s")
                elif current is not None:
                    results[pending[current]] = {
                        "status": "timeout",
                        "reason": "time budget spent" if over else
                        f"no result after {args.row_timeout:.0f} s (worker killed)"}
                break
            if line is False:
                rc = proc.wait()
                if current is not None and pending[current] not in results:
                    results[pending[current]] = {"status": "crashed",
                                                 "reason": f"worker exited with rc {rc}"}
                elif not ready and fatal is None:
                    fatal = f"worker exited with rc {rc} before it was ready (see fa3_worker.log)"
                break
            tag, _, payload = line.partition(" ")
            if tag == "PEER-READY":
                ready, ready_info = True, json.loads(payload)
                print(f"[peer] FA3 worker ready: {ready_info}", flush=True)
            elif tag == "PEER-FATAL":
                fatal = json.loads(payload)["reason"]
            elif tag == "PEER-START":
                current = int(payload)
                lines.deadline = min(deadline, time.time() + args.row_timeout)
            elif tag == "PEER-ROW":
                res = json.loads(payload)
                idx = pending[res.pop("index")]
                results[idx] = res
                current = None
                print(f"[peer] FA3 {rows[idx].label()}: " + ", ".join(
                    f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in res.items()), flush=True)
            else:
                log.write(line + "\n")
                log.flush()
        kill(proc)
        pending = [i for i in pending if i not in results]
        if fatal:
            for i in pending:
                results[i] = {"status": "error", "reason": fatal}
            pending = []
            break
        restarts += 1
        if restarts > args.max_restarts:
            break
    for i in pending:
        results[i] = {"status": "not run", "reason": "time budget spent" if time.time() >=
                      deadline - 5 else f"worker restarted {args.max_restarts} times"}
    return {rows[i].key: r for i, r in results.items()}, ready_info


def dry_run_plan(rows: list[grid.Row], opts: dict) -> str:
    """What each row would allocate and call, without a GPU."""
    lines = []
    for r in rows:
        s = grid.sizes(r)
        need = grid.fa3_need_bytes(r)
        lines.append(
            f"{r.label()}: hq {s.hq} hkv {s.hkv} d {s.d}, {s.pages} pages/seq, cache "
            f"[{s.blocks}, 16, {s.hkv}, {2 * s.d if opts['layout'] == 'packed' else s.d}] bf16 "
            f"{'(K|V packed)' if opts['layout'] == 'packed' else 'x2 (K, V)'} = "
            f"{need['kv'] / 2**30:.2f} GiB (+{need['work'] / 2**30:.2f} GiB work), reps "
            f"{grid.reps_for(s.kv_bytes, opts['quick'])}, block table {opts['block_table']}; "
            + "; ".join(
                f"{label}: get_scheduler_metadata(num_splits={n}, batch_size={r.batch}, "
                f"max_seqlen_k={r.context}, page_size={grid.PAGE}) -> flash_attn_varlen_func("
                f"fa_version=3, num_splits={n}, causal=True, max_seqlen_q=1)"
                for label, n in fa3_call.SPLIT_SETTINGS))
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="bench/peer_fa3.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", help="locks_bench_cuda to run first (default: $LOCKS_BENCH_BIN, "
                   f"else the first of {', '.join(DEFAULT_BENCH)} that exists)")
    p.add_argument("--bench-csv", help="use this bench CSV instead of running the bench")
    p.add_argument("--bench-log", help="with --bench-csv: the bench's stdout (for its ceiling)")
    p.add_argument("--quick", action="store_true", help="the bench's --quick grid (10 rows)")
    p.add_argument("--rows", help="'MODEL CONTEXT BATCH;...': only these rows (bench --only each)")
    p.add_argument("--out", default="gpu-out/peer", help="output folder (default %(default)s)")
    p.add_argument("--ceiling", type=float, help="read ceiling TB/s when the bench did not "
                   "measure one (--rows runs); default: the bench's --only constant, 4.4")
    p.add_argument("--block-table", default="perm", choices=["perm", "interleaved", "contiguous"],
                   help="FA3's block table: a random permutation (default), the bench's "
                   "interleaved table, or contiguous")
    p.add_argument("--layout", default="packed", choices=["packed", "split"],
                   help="FA3's cache: vLLM 0.26 FLASH_ATTN's [N, 16, H, 2d] (default) or K, V apart")
    p.add_argument("--row-timeout", type=float, default=90.0, help="seconds per FA3 row")
    p.add_argument("--ready-timeout", type=float, default=180.0,
                   help="seconds for the worker to import torch + vLLM and start CUDA")
    p.add_argument("--bench-timeout", type=float, default=300.0,
                   help="seconds for the bench (its whole grid takes ~2-4 min on the H200)")
    p.add_argument("--budget-s", type=float, default=570.0,
                   help="wall-clock budget of the whole invocation (rows past it: not run)")
    p.add_argument("--max-restarts", type=int, default=4, help="worker restarts after hangs")
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU: plan the rows (from --bench-csv or --rows), print, write the files")
    p.add_argument("--fake", action="store_true", help="worker with made-up times (tests)")
    args = p.parse_args(argv)
    if args.bench_csv and args.bench:
        p.error("--bench and --bench-csv exclude each other")
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    t0 = time.time()
    deadline = t0 + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    try:
        rows_arg = grid.parse_rows(args.rows) if args.rows else None
    except ValueError as e:
        print(f"peer_fa3: --rows: {e}", file=sys.stderr)
        return 2
    opts = {"quick": args.quick, "block_table": args.block_table, "layout": args.layout,
            "fake": args.fake}
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "commit": os.environ.get("LOCKS_COMMIT") or _git_commit(),
            "command": " ".join(["bench/peer_fa3.py"] + (sys.argv[1:] if argv is None else argv)),
            "fa3": {"splits": dict(fa3_call.SPLIT_SETTINGS), "block_table": args.block_table,
                    "layout": args.layout, "quick": args.quick}}
    bench_rows: list[grid.BenchRow] = []
    ceiling, source = None, ""
    if args.bench_csv:
        with open(args.bench_csv) as f:
            bench_rows = grid.parse_bench_csv(f.read())
        if args.bench_log:
            with open(args.bench_log) as f:
                log_text = f.read()
            ceiling = grid.parse_ceiling(log_text)
            bench_rows = grid.merge_bench_rows(bench_rows, grid.parse_bench_stdout(log_text))
        meta["bench"] = {"csv": args.bench_csv, "log": args.bench_log}
        source = f"measured by the bench ({args.bench_log})" if ceiling else ""
    elif not args.dry_run:
        args.bench = args.bench or os.environ.get("LOCKS_BENCH_BIN") or next(
            (p for p in (os.path.join(REPO, d) for d in DEFAULT_BENCH) if os.path.exists(p)), None)
        if not args.bench or not os.access(args.bench, os.X_OK):
            print(f"peer_fa3: no runnable bench binary ({args.bench or 'none found'}); give --bench, "
                  "or --bench-csv with the rows of an earlier run", file=sys.stderr)
            return 2
        info = run_bench(args, rows_arg, deadline)
        bench_rows, ceiling = info.pop("rows"), info.pop("ceiling")
        meta["bench"] = info
        source = "measured by the bench in this run" if ceiling else ""
    if ceiling is None:
        ceiling = args.ceiling or grid.ASSUMED_CEILING_TBPS
        source = ("given (--ceiling)" if args.ceiling else
                  "assumed: the bench's --only constant (no grid run measured one)")
    meta["ceiling_TBps"], meta["ceiling_source"] = ceiling, source
    rows = rows_arg or [b.row for b in bench_rows]
    if not rows:
        print("peer_fa3: no rows (the bench gave none; see bench.log)", file=sys.stderr)
        return 1
    with open(os.path.join(args.out, "fa3_worker.log"), "w") as log:
        if args.dry_run and not args.fake:
            print(dry_run_plan(rows, opts))
            fa3 = {r.key: {"status": "not run", "reason": "dry run"} for r in rows}
            meta["device"] = "dry run"
        else:
            fa3, meta["device"] = run_fa3(rows, opts, args, deadline, log)
    joined = report.join(bench_rows, fa3, ceiling, rows)
    meta["seconds"] = round(time.time() - t0, 1)
    table = report.format_table(joined, ceiling, source)
    print("\n" + table)
    with open(os.path.join(args.out, "peer_fa3.txt"), "w") as f:
        f.write(json.dumps(meta) + "\n\n" + table + "\n")
    report.write_csv(os.path.join(args.out, "peer_fa3.csv"), joined)
    report.write_json(os.path.join(args.out, "peer_fa3.json"), meta, joined, fa3)
    if args.dry_run and not args.fake:
        return 0
    # 0 only when every row was measured (output check passed) or cannot fit the device.
    bad = [r for r in rows if fa3[r.key].get("status") not in ("ok", "skipped")]
    bad += [j for j in joined if j["fa3_check"] == "FAILED"]
    return 1 if bad else 0


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
