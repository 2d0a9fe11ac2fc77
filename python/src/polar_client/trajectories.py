"""Exported trajectories (docs/EXPORT-SCHEMA.md, version 1) as training
samples: one [`Trace`] per Parquet (or JSONL) row, its token lists as numpy
arrays.

Reads a local export root, one file, or ``s3://bucket/prefix`` on any
S3-compatible store (pyarrow's S3 filesystem: credentials, region and
endpoint from [`S3`] or the ``AWS_*`` environment), or exactly the files
a finished task's samples name ([`load_task`]). Rows of another schema
version, and rows that break the schema's invariants, raise
[`TrajectoryError`]: nothing is silently dropped."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlparse

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from . import outcome
from .errors import TrajectoryError
from .outcome import Failures
from .types import Task

#: The export schema this reader understands.
SCHEMA_VERSION = 1

#: The chain roles a trace may have (``Trace.chain_role``).
CHAIN_ROLES = ("main", "sub_agent", "side")

IntArray = npt.NDArray[np.int64]
MaskArray = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Trace:
    """One training sample: an exported row. The model's input is
    ``prompt_ids + response_ids``; the loss applies where ``loss_mask`` is
    1 (tokens the policy generated); ``logprobs`` are the sampling
    log-probabilities over ``response_ids`` (0.0 where the mask is 0;
    ``None`` when the backend gave none)."""

    trace_id: str
    session_id: str
    task_id: str | None
    group_id: str | None
    attempt: int | None
    """Which attempt of the session the trace came from (1, 2, ...);
    ``None`` outside the rollout path and in files written before the
    column existed."""
    chain_role: str | None
    """``main``, ``sub_agent`` or ``side``."""
    policy_version: str | None
    """The version every call ran under; ``None`` when they differ (see
    [`Trace.policy_versions`] and [`Trace.version_mask`])."""
    weight_version: str | None
    status: str
    labels: tuple[str, ...]
    trace_index: int
    chain: int
    segment: int
    finish_reason: str | None
    reward: float | None
    prompt_ids: IntArray
    response_ids: IntArray
    loss_mask: MaskArray
    logprobs: FloatArray | None
    trace_metadata: Mapping[str, Any] = field(repr=False)
    trajectory_metadata: Mapping[str, Any] = field(repr=False)

    @property
    def input_ids(self) -> IntArray:
        """``prompt_ids + response_ids``."""
        return np.concatenate([self.prompt_ids, self.response_ids])

    @property
    def policy_versions(self) -> tuple[str, ...]:
        """The distinct versions of the calls merged into this trace, in order."""
        return tuple(self.trace_metadata.get("policy_versions") or ())

    @property
    def faulty(self) -> bool:
        """The infrastructure or the evaluator ended the session: drop it."""
        return "infra_fault" in self.labels or "evaluator_fault" in self.labels

    def version_mask(self, version: str) -> MaskArray:
        """``loss_mask`` restricted to the tokens generated under
        ``version`` (per call span), for traces that span a weight update."""
        keep = np.zeros(len(self.response_ids), dtype=np.uint8)
        for span in self.trace_metadata.get("spans") or ():
            if span.get("policy_version") == version:
                start = int(span["response_start"])
                keep[start : start + int(span["response_len"])] = 1
        return self.loss_mask & keep


@dataclass(frozen=True)
class S3:
    """How to reach an S3-compatible store; unset fields come from the
    ``AWS_*`` environment (``AWS_ENDPOINT_URL`` for the endpoint)."""

    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None

    def filesystem(self) -> pafs.S3FileSystem:
        endpoint = self.endpoint or os.environ.get("AWS_ENDPOINT_URL") or None
        kwargs: dict[str, Any] = {}
        if endpoint is not None:
            u = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
            kwargs["endpoint_override"] = u.netloc
            kwargs["scheme"] = u.scheme
        region = self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            kwargs["region"] = region
        key = self.access_key or os.environ.get("AWS_ACCESS_KEY_ID")
        secret = self.secret_key or os.environ.get("AWS_SECRET_ACCESS_KEY")
        if key and secret:
            kwargs["access_key"] = key
            kwargs["secret_key"] = secret
        return pafs.S3FileSystem(**kwargs)


def partition(task_id: str) -> str:
    """The export's directory name for a task (``task=<escaped id>``), or
    ``""`` when the id is too long to be predicted (then every file is read
    and rows are selected by their ``task_id``)."""
    safe = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
    raw = task_id.encode()
    out = "".join(
        chr(b) if b in safe and not (i == 0 and b == ord(".")) else f"%{b:02X}" for i, b in enumerate(raw)
    )
    return "" if len(out) > 180 else f"task={out}"


def _fs_and_path(source: str, s3: S3 | None) -> tuple[pafs.FileSystem, str]:
    if source.startswith("s3://"):
        return (s3 or S3()).filesystem(), source[len("s3://") :].rstrip("/")
    return pafs.LocalFileSystem(), os.path.abspath(source)


def _export_files(fs: pafs.FileSystem, root: str, suffix: str = ".parquet") -> list[str]:
    """``root`` itself when it is a file, else the files under it whose
    names end with ``suffix``."""
    try:
        info = fs.get_file_info(root)
    except OSError as e:
        raise TrajectoryError(f"{root}: {e}") from e
    if info.type == pafs.FileType.File:
        return [root]
    if info.type == pafs.FileType.NotFound:
        raise TrajectoryError(f"{root}: no such file or directory")
    found = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return sorted(
        f.path
        for f in found
        if f.type == pafs.FileType.File
        and f.path.endswith(suffix)
        # Dot-files are writers' temporaries (`.tmp-...partial`).
        and not any(part.startswith(".") for part in f.path[len(root) :].split("/"))
    )


def load(source: str | os.PathLike[str], *, task_id: str | None = None, s3: S3 | None = None) -> list[Trace]:
    """Every trace under an export root (a directory or ``s3://bucket/prefix``:
    its Parquet files) or in one Parquet or JSONL file; with ``task_id``,
    only that task's."""
    fs, root = _fs_and_path(os.fspath(source), s3)
    if task_id is not None and partition(task_id):
        sub = f"{root}/{partition(task_id)}"
        if fs.get_file_info(sub).type == pafs.FileType.Directory:
            root = sub
    files = _export_files(fs, root)
    traces = [t for f in files for t in read_file(f, fs)]
    if task_id is not None:
        traces = [t for t in traces if t.task_id == task_id]
    return traces


def load_task(task: Task, *, s3: S3 | None = None, failures: Failures = "raise") -> list[Trace]:
    """The traces of a finished task's done samples, read from each
    sample's ``trajectory_uri`` (the attempt whose result the server
    accepted), in sample order. A task with no usable sample raises
    [`TaskFailed`] with its failures grouped (``failures="warn"``: warns
    and returns the traces of its failed samples, labelled; ``"ignore"``:
    neither); one with fewer usable than requested warns."""
    outcome.check(task, failures)
    out: list[Trace] = []
    for sample in task.samples:
        uri = sample.result.trajectory_uri if sample.result is not None else None
        if uri is None:
            continue
        if not uri.endswith(".parquet"):
            raise TrajectoryError(
                f"{sample.session_id}: {uri} is not Parquet (add \"parquet\" to the gateway's `formats`)"
            )
        fs, path = _fs_and_path(uri, s3)
        out.extend(read_file(path, fs))
    return out


def read_file(path: str, fs: pafs.FileSystem | None = None) -> list[Trace]:
    """The traces of one export file: Parquet, or JSON Lines (``.jsonl``,
    the same rows as the gateway's ``formats = ["jsonl"]`` writes them)."""
    fs = fs or pafs.LocalFileSystem()
    try:
        if path.endswith(".jsonl"):
            with fs.open_input_stream(path) as f:
                rows = [json.loads(line) for line in f.read().decode("utf-8").splitlines() if line.strip()]
            table = pa.Table.from_pylist([_jsonl_row(r) for r in rows])
        else:
            table = pq.read_table(path, filesystem=fs)
    except (OSError, ValueError, pa.ArrowException) as e:
        hint = "" if path.endswith((".parquet", ".jsonl")) else " (an export file is .parquet or .jsonl)"
        raise TrajectoryError(f"{path}: {e}{hint}") from e
    return from_table(table, path)


def _jsonl_row(row: Any) -> dict[str, Any]:
    """A JSONL row with its JSON columns as text, as Parquet has them."""
    if not isinstance(row, dict):
        raise ValueError(f"a row is not a JSON object: {str(row)[:80]}")
    for k in ("trace_metadata", "trajectory_metadata"):
        if isinstance(row.get(k), (dict, list)):
            row[k] = json.dumps(row[k])
    return row


def _lists(table: pa.Table, name: str, dtype: type[np.generic]) -> list[Any]:
    """A ``list<...>`` column as one numpy array per row (views of one
    buffer); ``None`` for null rows."""
    col = table.column(name).combine_chunks()
    values = col.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    # `flatten` starts at the first row's values: offsets relative to it.
    offsets = col.offsets.to_numpy()
    offsets = offsets - offsets[0]
    valid = col.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(col))]


def from_table(table: pa.Table, origin: str = "<table>") -> list[Trace]:
    """The traces of an Arrow table with the export's columns."""
    names = set(table.column_names)
    missing = {"schema_version", "trace_id", "prompt_ids", "response_ids", "loss_mask"} - names
    if missing:
        raise TrajectoryError(f"{origin}: not a Polar export (no {', '.join(sorted(missing))} column)")
    versions = set(table.column("schema_version").to_pylist())
    if versions - {SCHEMA_VERSION}:
        raise TrajectoryError(
            f"{origin}: export schema version {sorted(versions)} (this reader knows {SCHEMA_VERSION})"
        )
    rows = table.drop_columns([c for c in ("prompt_ids", "response_ids", "loss_mask", "response_logprobs") if c in names])
    plain = rows.to_pylist()
    prompts = _lists(table, "prompt_ids", np.int64)
    responses = _lists(table, "response_ids", np.int64)
    masks = _lists(table, "loss_mask", np.uint8)
    logprobs = _lists(table, "response_logprobs", np.float32) if "response_logprobs" in names else [None] * len(plain)
    out = []
    for r, p, resp, m, lp in zip(plain, prompts, responses, masks, logprobs):
        out.append(_trace(r, p, resp, m, lp, origin))
    return out


def _json(value: Any) -> Mapping[str, Any]:
    if value is None:
        return {}
    parsed = json.loads(value) if isinstance(value, str) else value
    return parsed if isinstance(parsed, dict) else {}


def _trace(r: Mapping[str, Any], p: Any, resp: Any, m: Any, lp: Any, origin: str) -> Trace:
    tid = r["trace_id"]
    if p is None or resp is None or m is None:
        raise TrajectoryError(f"{origin}: {tid}: a token list is null")
    if len(m) != len(resp):
        raise TrajectoryError(f"{origin}: {tid}: loss_mask has {len(m)} entries for {len(resp)} response tokens")
    if m.size and int(m.max()) > 1:
        raise TrajectoryError(f"{origin}: {tid}: loss_mask holds a value other than 0 and 1")
    if lp is not None and len(lp) != len(resp):
        raise TrajectoryError(f"{origin}: {tid}: response_logprobs has {len(lp)} entries for {len(resp)} tokens")
    return Trace(
        trace_id=tid,
        session_id=r["session_id"],
        task_id=r.get("task_id"),
        group_id=r.get("group_id"),
        attempt=None if r.get("attempt") is None else int(r["attempt"]),
        chain_role=r.get("chain_role"),
        policy_version=r.get("policy_version"),
        weight_version=r.get("weight_version"),
        status=r["status"],
        labels=tuple(r.get("labels") or ()),
        trace_index=int(r["trace_index"]),
        chain=int(r["chain"]),
        segment=int(r["segment"]),
        finish_reason=r.get("finish_reason"),
        reward=None if r.get("reward") is None else float(r["reward"]),
        prompt_ids=p,
        response_ids=resp,
        loss_mask=m,
        logprobs=lp,
        trace_metadata=_json(r.get("trace_metadata")),
        trajectory_metadata=_json(r.get("trajectory_metadata")),
    )


def select(
    traces: Iterable[Trace],
    *,
    roles: Sequence[str] | None = ("main",),
    policy_versions: Sequence[str] | None = None,
    drop_faults: bool = True,
) -> list[Trace]:
    """The traces to train on: of the chain ``roles`` (``None``: all), not
    ended by a fault (``drop_faults``), and generated entirely under one of
    ``policy_versions`` (``None``: any; stale samples are left out). A role
    other than ``main``, ``sub_agent`` and ``side`` raises ``ValueError``
    (a typo would select nothing)."""
    if roles is not None:
        if isinstance(roles, str):
            raise ValueError(f"roles={roles!r}: a sequence of roles, e.g. [{roles!r}]")
        unknown = sorted(set(roles) - set(CHAIN_ROLES))
        if unknown:
            raise ValueError(f"unknown chain role {', '.join(map(repr, unknown))}: one of {', '.join(CHAIN_ROLES)}")
    out = []
    for t in traces:
        if roles is not None and t.chain_role not in roles:
            continue
        if drop_faults and t.faulty:
            continue
        if policy_versions is not None and t.policy_version not in policy_versions:
            continue
        out.append(t)
    return out
