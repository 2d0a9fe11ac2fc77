"""Exported calls files (docs/EXPORT-SCHEMA.md, "Calls files", version 1):
every model call a session made, as the node captured it (the native
request the harness sent, the normalized request, the reply, token ids,
logprobs, faults, weight versions), with the session's ``session.json``.
One file per session, ``task=<task>/<session>.calls.jsonl.zst`` beside its
trajectories, under a local export root or ``s3://bucket/prefix``.

[`load_calls`] reads them (pyarrow's file systems and zstd codec);
[`rederive`] runs the trajectory builders over them through the ``polar``
CLI (``polar export --from``) with no node involved. A truncated or
foreign file, and one of a newer layout version, raise
[`TrajectoryError`] naming the file."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.fs as pafs

from .errors import TrajectoryError
from .trajectories import S3, _export_files, _fs_and_path, partition

#: The calls file layout this client reads.
CALLS_SCHEMA_VERSION = 1
#: A calls file's name after its session's escaped id.
CALLS_SUFFIX = ".calls.jsonl.zst"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Call:
    """One captured model call. ``record`` is the whole capture record
    (docs/EXPORT-SCHEMA.md lists its keys); the rest are views of it."""

    call_id: str
    seq: int
    #: ``completed`` or ``failed`` (then ``record["side"]`` and
    #: ``record["error"]`` say why).
    status: str
    native_request: Mapping[str, Any]
    response: Mapping[str, Any] | None
    prompt_ids: npt.NDArray[np.int64] | None
    response_ids: npt.NDArray[np.int64] | None
    response_logprobs: npt.NDArray[np.float32] | None
    record: Mapping[str, Any]


@dataclass(frozen=True)
class SessionCalls:
    """One session's calls file."""

    session_id: str
    task_id: str | None
    #: The session's ``session.json`` as its node had it (outcome,
    #: evaluation, reward, attempt, ...); empty when it had none.
    session: Mapping[str, Any]
    calls: tuple[Call, ...]
    #: Where it was read from.
    path: str


def _ids(v: Any, dtype: type[np.generic]) -> Any:
    return None if v is None else np.asarray(v, dtype=dtype)


def _call(r: Mapping[str, Any]) -> Call:
    return Call(
        call_id=r["call_id"],
        seq=int(r["seq"]),
        status=str(r["status"]),
        native_request=r["native_request"],
        response=r.get("response"),
        prompt_ids=_ids(r.get("prompt_token_ids"), np.int64),
        response_ids=_ids(r.get("response_token_ids"), np.int64),
        response_logprobs=_ids(r.get("response_logprobs"), np.float32),
        record=r,
    )


def parse_calls(data: bytes, path: str = "<bytes>") -> SessionCalls:
    """A calls file's bytes, decoded and checked."""
    if not data.startswith(_ZSTD_MAGIC):
        raise TrajectoryError(f"{path}: not a Polar calls file: no zstd frame at byte offset 0")
    stream = pa.CompressedInputStream(pa.BufferReader(data), "zstd")
    chunks = []
    try:
        while True:
            chunk = stream.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    except (OSError, pa.ArrowException) as e:
        got = sum(len(c) for c in chunks)
        raise TrajectoryError(
            f"{path}: truncated or corrupt zstd stream ({len(data)} bytes; "
            f"{got} decompressed bytes before the error): {e}"
        ) from e
    text = b"".join(chunks)
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        raise TrajectoryError(
            f"{path}: truncated: the last line (decompressed byte offset {len(text) - len(lines[-1])}) has no end"
        )
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError as e:
        raise TrajectoryError(f"{path}: not a Polar calls file: the first line is not JSON: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("polar_calls"), int):
        raise TrajectoryError(f"{path}: not a Polar calls file: the first line has no \"polar_calls\" version")
    if header["polar_calls"] > CALLS_SCHEMA_VERSION:
        raise TrajectoryError(
            f"{path}: calls file schema version {header['polar_calls']} is newer than this client reads "
            f"({CALLS_SCHEMA_VERSION}): upgrade polar-client"
        )
    calls = []
    offset = len(lines[0]) + 1 if lines else 0
    for number, line in enumerate(lines[1:], start=2):
        try:
            calls.append(_call(json.loads(line)))
        except (ValueError, KeyError, TypeError) as e:
            raise TrajectoryError(
                f"{path}: line {number} (decompressed byte offset {offset}) is not a call record: {e}"
            ) from e
        offset += len(line) + 1
    if len(calls) != header.get("calls"):
        raise TrajectoryError(f"{path}: the header says {header.get('calls')} calls, the file holds {len(calls)}")
    session = header.get("session")
    return SessionCalls(
        session_id=header["session_id"],
        task_id=header.get("task_id"),
        session=session if isinstance(session, dict) else {},
        calls=tuple(calls),
        path=path,
    )


def read_calls(path: str, fs: pafs.FileSystem | None = None) -> SessionCalls:
    """One calls file."""
    try:
        # No `compression="detect"`: the bytes are checked as they are.
        with (fs or pafs.LocalFileSystem()).open_input_stream(path, compression=None) as f:
            data = f.read()
    except OSError as e:
        raise TrajectoryError(f"{path}: {e}") from e
    return parse_calls(data, path)


def load_calls(
    source: str | os.PathLike[str], *, task_id: str | None = None, s3: S3 | None = None
) -> list[SessionCalls]:
    """Every session's calls under an export root (a directory or
    ``s3://bucket/prefix``) or in one calls file; with ``task_id``, only
    that task's. Sorted by file name."""
    fs, root = _fs_and_path(os.fspath(source), s3)
    if task_id is not None and partition(task_id):
        sub = f"{root}/{partition(task_id)}"
        if fs.get_file_info(sub).type == pafs.FileType.Directory:
            root = sub
    out = [read_calls(f, fs) for f in _export_files(fs, root, CALLS_SUFFIX)]
    if task_id is not None:
        out = [s for s in out if s.task_id == task_id]
    return out


def rederive(
    source: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    builder: str | Mapping[str, Any] = "prefix_merging",
    task_ids: Sequence[str] = (),
    since: str | int | None = None,
    until: str | int | None = None,
    formats: str = "parquet",
    polar: str | os.PathLike[str] | None = None,
    s3: S3 | None = None,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Rebuilds trajectories from the calls files under ``source`` into
    ``out`` with ``builder`` (``"per_request"``, ``"prefix_merging"``, or
    the builder as a dict, e.g. ``{"kind": "prefix_merging", "splice":
    False}``), through ``polar export --from``: the builders are the
    node's own. ``since``/``until``: RFC 3339 or Unix milliseconds.
    ``polar``: the binary (default: ``$POLAR_BIN``, else ``polar`` on the
    ``PATH``). ``s3``: the store of an ``s3://`` source or destination
    (what it leaves out comes from the ``AWS_*`` environment). Returns
    the export's summary; a session that could not be re-derived is listed
    in its ``sessions_failed`` and raises [`TrajectoryError`]."""
    binary = os.fspath(polar) if polar is not None else os.environ.get("POLAR_BIN") or shutil.which("polar")
    if not binary:
        raise TrajectoryError("no polar binary: pass polar= or set POLAR_BIN")
    argv = [binary, "export", "--from", os.fspath(source), "--out", os.fspath(out), "--format", formats, "--json"]
    if isinstance(builder, str):
        argv += ["--builder", builder]
    else:
        argv += ["--builder-json", json.dumps(builder)]
    for t in task_ids:
        argv += ["--task", t]
    if since is not None:
        argv += ["--since", str(since)]
    if until is not None:
        argv += ["--until", str(until)]
    env = dict(os.environ)
    if s3 is not None:
        # The endpoint as an option: plain HTTP is allowed for a loopback
        # one only when named there.
        if s3.endpoint:
            argv += ["--s3-endpoint", s3.endpoint]
        if s3.region:
            argv += ["--s3-region", s3.region]
        for key, value in (("AWS_ACCESS_KEY_ID", s3.access_key), ("AWS_SECRET_ACCESS_KEY", s3.secret_key)):
            if value:
                env[key] = value
    argv += list(extra_args)
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    try:
        summary: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        raise TrajectoryError(f"polar export failed (exit {done.returncode}): {done.stderr.strip()}") from None
    if done.returncode != 0 or summary.get("sessions_failed"):
        failed = "; ".join(f"{f['dir']}: {f['error']}" for f in summary.get("sessions_failed", []))
        raise TrajectoryError(f"polar export --from {os.fspath(source)}: {failed or done.stderr.strip()}")
    return summary
