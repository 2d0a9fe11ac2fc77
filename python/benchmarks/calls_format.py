"""The calls file's format, measured: the same session's capture records as
JSONL.zst (what Polar writes) and as Parquet with the bodies as JSON
columns (flat columns for ids, status and timings; token ids and logprobs
as lists; the native request, normalized request and reply as JSON text),
zstd level 3 for both. Size, and the time to read every record back into
Python objects with pyarrow (median of 5).

    cargo bench -p polar-export --bench calls   # with POLAR_BENCH_CALLS_OUT=/tmp/s.calls.jsonl.zst
    python python/benchmarks/calls_format.py /tmp/s.calls.jsonl.zst

Prints one line per format (BENCHMARKS.md, "Calls files")."""

from __future__ import annotations

import io
import json
import statistics
import sys
import time
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from polar_client.calls import parse_calls

BODIES = ("native_request", "request", "response", "backend", "timings", "resumed")


def timed(f: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(5):
        t = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def to_parquet(records: list[dict[str, Any]]) -> bytes:
    cols: dict[str, list[Any]] = {
        "call_id": [r["call_id"] for r in records],
        "seq": [r["seq"] for r in records],
        "session_id": [r["session_id"] for r in records],
        "status": [r["status"] for r in records],
        "prompt_token_ids": [r.get("prompt_token_ids") for r in records],
        "response_token_ids": [r.get("response_token_ids") for r in records],
        "response_logprobs": [r.get("response_logprobs") for r in records],
    }
    for b in BODIES:
        cols[b] = [json.dumps(r.get(b)) for r in records]
    skip = set(cols) | set(BODIES)
    cols["rest"] = [json.dumps({k: v for k, v in r.items() if k not in skip}) for r in records]
    table = pa.table(
        cols,
        schema=pa.schema(
            [
                ("call_id", pa.string()),
                ("seq", pa.uint64()),
                ("session_id", pa.string()),
                ("status", pa.string()),
                ("prompt_token_ids", pa.list_(pa.uint32())),
                ("response_token_ids", pa.list_(pa.uint32())),
                ("response_logprobs", pa.list_(pa.float32())),
                *[(b, pa.string()) for b in BODIES],
                ("rest", pa.string()),
            ]
        ),
    )
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd", compression_level=3)
    return out.getvalue()


def read_parquet(data: bytes) -> list[dict[str, Any]]:
    t = pq.read_table(pa.BufferReader(data)).to_pydict()
    out = []
    for i in range(t["call_id"].__len__()):
        r = json.loads(t["rest"][i])
        for k in ("call_id", "seq", "session_id", "status", "prompt_token_ids", "response_token_ids", "response_logprobs"):
            r[k] = t[k][i]
        for b in BODIES:
            r[b] = json.loads(t[b][i])
        out.append(r)
    return out


def main(path: str) -> None:
    data = open(path, "rb").read()
    records = [dict(c.record) for c in parse_calls(data, path).calls]
    n = len(records)
    raw = sum(len(json.dumps(r)) + 1 for r in records)
    t_jsonl, back = timed(lambda: parse_calls(data, path))
    assert len(back.calls) == n
    pq_bytes = to_parquet(records)
    t_pq, rows = timed(lambda: read_parquet(pq_bytes))
    assert len(rows) == n
    print(f"{n} calls, {raw / 1e6:.2f} MB as JSON lines")
    print(f"JSONL.zst:                {len(data) / 1e6:.3f} MB ({len(data) // n} B/call); read {t_jsonl * 1e3:.1f} ms")
    print(f"Parquet, JSON body cols:  {len(pq_bytes) / 1e6:.3f} MB ({len(pq_bytes) // n} B/call); read {t_pq * 1e3:.1f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
