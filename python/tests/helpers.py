"""Checks shared by the client's and the bridges' tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from polar_client import S3, Task, Trace


def jsonl_rows(export: Path | str, task_id: str, s3: S3 | None = None) -> list[dict[str, Any]]:
    """The JSONL rows Polar wrote beside the Parquet files of a task, under
    an export directory or (with ``s3``) an ``s3://bucket/prefix``, read
    with pyarrow's file systems: an encoding independent of the Parquet
    reader, to check it against."""
    if s3 is None:
        fs: pafs.FileSystem = pafs.LocalFileSystem()
        root = str(export)
    else:
        fs = s3.filesystem()
        root = str(export).removeprefix("s3://")
    found = fs.get_file_info(pafs.FileSelector(f"{root}/task={task_id}"))
    rows = []
    for f in sorted(x.path for x in found if x.path.endswith(".jsonl")):
        with fs.open_input_stream(f) as stream:
            rows.extend(json.loads(line) for line in stream.read().decode().splitlines() if line)
    return rows


def check_against_rows(traces: list[Trace], rows: list[dict[str, Any]]) -> None:
    """Each trace equals its JSONL row, field by field."""
    by_id = {r["trace_id"]: r for r in rows}
    assert sorted(by_id) == sorted(t.trace_id for t in traces)
    for t in traces:
        r = by_id[t.trace_id]
        assert t.session_id == r["session_id"]
        assert t.task_id == r["task_id"]
        assert t.group_id == r["group_id"]
        assert t.attempt == r["attempt"]
        assert t.chain_role == r["chain_role"]
        assert t.policy_version == r["policy_version"]
        assert t.weight_version == r["weight_version"]
        assert t.status == r["status"]
        assert list(t.labels) == r["labels"]
        assert (t.trace_index, t.chain, t.segment) == (r["trace_index"], r["chain"], r["segment"])
        assert t.finish_reason == r["finish_reason"]
        assert t.reward == r["reward"]
        assert t.prompt_ids.dtype == np.int64 and t.prompt_ids.tolist() == r["prompt_ids"]
        assert t.response_ids.tolist() == r["response_ids"]
        assert t.loss_mask.tolist() == r["loss_mask"]
        assert t.logprobs is not None and r["response_logprobs"] is not None
        assert t.logprobs.dtype == np.float32
        # Float32 in Parquet, the same float32 value printed in JSON.
        assert t.logprobs.tolist() == np.array(r["response_logprobs"], dtype=np.float32).tolist()
        assert dict(t.trace_metadata) == r["trace_metadata"]
        assert dict(t.trajectory_metadata) == r["trajectory_metadata"]


def check_done(task: Task, n: int) -> None:
    """Every one of the ``n`` samples done, completed, rewarded 1, with a
    trajectory."""
    assert task.status == "completed", task
    assert len(task.samples) == n
    for s in task.samples:
        assert s.state == "done", s
        assert s.result is not None and s.result.status == "completed", s
        assert s.result.reward == 1.0
        assert s.result.trajectory_uri is not None
        assert s.result.calls >= 2
