"""The rows of the kernel bench's grid: model shapes, the bench's CSV and log, sizes per row.

The grid has one source, the C++ bench (bench/cuda/bench_decode.cu): the rows come from its CSV
(or its stdout when the CSV was lost); only the shapes behind the model names are repeated here,
and tests/python/test_peer_fa3.py checks them against the bench's kModels table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

PAGE = 16  # tokens per KV block: the bench's kP and the block size vLLM's LOCKS backend asks for

# name: (query heads, KV heads, head_dim), in kModels' order (--only picks the first prefix match)
MODELS: dict[str, tuple[int, int, int]] = {
    "Llama-3.1-8B": (32, 8, 128),
    "GLM-4-9B": (32, 2, 128),
    "Qwen2.5-7B": (28, 4, 128),
    "Llama-3.1-70B-TP8": (8, 1, 128),
    "SmolLM2-135M": (9, 3, 64),
    "Gemma-3-270M-global": (4, 1, 256),
    "Gemma-3-4B-global": (8, 4, 256),
}

# The bench's --only runs do not measure the read ceiling and use this constant instead.
ASSUMED_CEILING_TBPS = 4.4

CSV_HEADER_START = "model,context,batch,"


@dataclass(frozen=True)
class Row:
    model: str
    context: int
    batch: int

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.model, self.context, self.batch)

    def label(self) -> str:
        return f"{self.model} {self.context} {self.batch}"


@dataclass
class BenchRow:
    """One row of the bench: its numbers (CSV column -> float) or why it was skipped."""

    row: Row
    fields: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None


def resolve_model(prefix: str) -> str:
    """The bench's --only rule: the first model whose name starts with prefix."""
    for name in MODELS:
        if name.startswith(prefix):
            return name
    raise ValueError(f"no model name starts with {prefix!r} (models: {', '.join(MODELS)})")


def parse_rows(spec: str) -> list[Row]:
    """'MODEL CONTEXT BATCH;...' (the bench's --only arguments, ';'-separated) -> rows."""
    rows = []
    for part in spec.split(";"):
        words = part.split()
        if not words:
            continue
        if len(words) != 3:
            raise ValueError(f"row {part.strip()!r}: want 'MODEL CONTEXT BATCH'")
        try:
            ctx, batch = int(words[1]), int(words[2])
        except ValueError:
            raise ValueError(f"row {part.strip()!r}: context and batch must be integers") from None
        if ctx < PAGE or ctx % PAGE:
            raise ValueError(f"row {part.strip()!r}: context must be a positive multiple of {PAGE}")
        if batch < 1:
            raise ValueError(f"row {part.strip()!r}: batch must be >= 1")
        rows.append(Row(resolve_model(words[0]), ctx, batch))
    if not rows:
        raise ValueError("no rows given")
    return rows


def parse_bench_csv(text: str) -> list[BenchRow]:
    """The bench's CSV (one or several files concatenated, each with its header line).

    A skipped row is 'model,context,batch,skipped: why' with an unquoted reason that may hold
    commas, so lines are split by hand rather than by the csv module."""
    header: list[str] | None = None
    out: list[BenchRow] = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if line.startswith(CSV_HEADER_START):
            header = line.split(",")
            continue
        if header is None:
            raise ValueError(f"bench CSV line {n}: data before the header line")
        head = line.split(",", 3)
        if len(head) < 4:
            raise ValueError(f"bench CSV line {n}: fewer than 4 fields")
        row = Row(head[0], int(head[1]), int(head[2]))
        if row.model not in MODELS:
            raise ValueError(f"bench CSV line {n}: unknown model {row.model!r} (bench and "
                             "bench/peer/grid.py MODELS disagree)")
        if head[3].startswith("skipped:"):
            out.append(BenchRow(row, skipped=head[3][len("skipped:"):].strip()))
            continue
        cells = line.split(",")
        if len(cells) != len(header):
            raise ValueError(f"bench CSV line {n}: {len(cells)} fields, header has {len(header)}")
        out.append(BenchRow(row, {k: float(v) for k, v in zip(header[3:], cells[3:])}))
    return out


_CEILING = re.compile(r"^read ceiling \([^)]*\): ([0-9.]+) TB/s", re.M)
# A measured row on the bench's stdout: model, context, batch | dense_ms locks_ms xtime ...
_STDOUT_ROW = re.compile(r"^(\S+)\s+(\d+)\s+(\d+) \|\s+([0-9.]+)\s+([0-9.]+)\s", re.M)
_STDOUT_SKIP = re.compile(r"^(\S+)\s+(\d+)\s+(\d+) \| skipped: (.*)$", re.M)


def parse_ceiling(log: str) -> float | None:
    """The read ceiling the bench measured (TB/s), or None (--only runs do not measure it)."""
    m = _CEILING.search(log)
    return float(m.group(1)) if m else None


def parse_bench_stdout(log: str) -> list[BenchRow]:
    """Rows from the bench's printed table: the fallback when its CSV was not written out
    (the CSV is buffered, so a bench killed by its timeout leaves it incomplete)."""
    found: list[tuple[int, BenchRow]] = []
    for m in _STDOUT_ROW.finditer(log):
        if m.group(1) in MODELS:
            row = Row(m.group(1), int(m.group(2)), int(m.group(3)))
            found.append((m.start(), BenchRow(row, {"dense_ms": float(m.group(4)),
                                                    "locks_ms": float(m.group(5))})))
    for m in _STDOUT_SKIP.finditer(log):
        if m.group(1) in MODELS:
            row = Row(m.group(1), int(m.group(2)), int(m.group(3)))
            found.append((m.start(), BenchRow(row, skipped=m.group(4).strip())))
    return [r for _, r in sorted(found, key=lambda t: t[0])]


def merge_bench_rows(csv_rows: list[BenchRow], stdout_rows: list[BenchRow]) -> list[BenchRow]:
    """CSV rows first (all columns); rows only the stdout has are appended in its order."""
    seen = {r.row.key for r in csv_rows}
    return csv_rows + [r for r in stdout_rows if r.row.key not in seen]


def reps_for(dense_bytes: float, quick: bool) -> int:
    """Replays per timing, the bench's reps_for (the median of these, 2 warm-ups before)."""
    if dense_bytes > 16e9:
        return 3
    if dense_bytes > 4e9:
        return 5
    return 7 if quick else 11


@dataclass(frozen=True)
class Sizes:
    hq: int
    hkv: int
    d: int
    pages: int  # per sequence
    blocks: int  # in the cache: every sequence's pages, no sharing
    kv_bytes: int  # K and V together (bf16): what a dense decode step reads

    @property
    def dense_bytes(self) -> int:
        return self.kv_bytes


# For the memory estimate only: an upper bound on the splits FA3's heuristic picks (it stays
# within the SM count); split partials are [splits, batch, heads, d] fp32 plus an fp32 LSE.
MAX_HEURISTIC_SPLITS = 256
FLUSH_BYTES = 256 << 20  # the bench's L2 flush buffer
MARGIN_BYTES = 1 << 30  # the bench's headroom


def sizes(row: Row) -> Sizes:
    hq, hkv, d = MODELS[row.model]
    pages = row.context // PAGE
    blocks = pages * row.batch
    return Sizes(hq, hkv, d, pages, blocks, 2 * blocks * PAGE * hkv * d * 2)


def fa3_need_bytes(row: Row) -> dict[str, int]:
    """Device memory one FA3 row allocates (the cache dominates)."""
    s = sizes(row)
    qo = 2 * row.batch * s.hq * s.d * 2
    accum = MAX_HEURISTIC_SPLITS * row.batch * s.hq * (s.d + 1) * 4
    tables = s.blocks * 4 + 64 * row.batch
    return {"kv": s.kv_bytes, "work": qo + accum + tables + FLUSH_BYTES}


def fit_reason(row: Row, free: int, total: int) -> str | None:
    """Why the row's FA3 cache does not fit (the bench's wording), or None when it fits."""
    need = fa3_need_bytes(row)
    gib = float(1 << 30)
    if need["kv"] + need["work"] + MARGIN_BYTES <= free:
        return None
    return (f"needs {(need['kv'] + need['work']) / gib:.1f} GiB (K+V {need['kv'] / gib:.1f}, "
            f"workspace {need['work'] / gib:.1f}) of {free / gib:.1f} GiB free "
            f"({total / gib:.1f} GiB device)")
