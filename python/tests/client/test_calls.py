"""The exported calls files against the real stack: every session's calls
are in the export once the node dropped its copy, read with pyarrow
(``load_calls``), and the builders run over them through ``polar export
--from`` (``rederive``) give the trajectories the node exported. Damaged
files are refused, naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

import polar_client as pc
from helpers import check_against_rows, check_done, jsonl_rows
from stack import GATEWAY_TOKEN, S3_EXPORT, TRAINER_TOKEN, Moto, Stack, task


def test_calls_are_exported_and_rederive_the_same_trajectories(stack: Stack, task_id: str, tmp_path: Path) -> None:
    client = pc.Client(stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN)
    client.submit(task(task_id, 2))
    t = client.wait(task_id, timeout=120)
    check_done(t, 2)
    sessions = pc.load_calls(stack.export, task_id=task_id)
    assert {s.session_id for s in sessions} == {s.session_id for s in t.samples}
    for s in sessions:
        sample = next(x for x in t.samples if x.session_id == s.session_id)
        assert sample.result is not None
        assert s.task_id == task_id and s.session["task_id"] == task_id
        assert s.session["reward"] == 1.0 and s.session["outcome"]["kind"] == "completed"
        assert len(s.calls) == sample.result.calls >= 2
        assert sample.result.stats is not None and sample.result.stats["calls_uri"] == s.path
        assert [c.seq for c in s.calls] == sorted(c.seq for c in s.calls)
        for c in s.calls:
            # What the harness actually sent, and what it got back.
            assert c.status == "completed" and c.native_request["body"]["messages"]
            assert c.response is not None
            assert c.prompt_ids is not None and len(c.prompt_ids) > 0
            assert c.response_ids is not None and c.response_logprobs is not None
            assert len(c.response_ids) == len(c.response_logprobs)
        # The node removed its copy: the export is the only one.
        assert not any(Path(stack.dir).glob(f"**/state/sessions/{s.session_id}"))

    out = tmp_path / "rederived"
    summary = pc.rederive(stack.export, out, task_ids=[task_id], formats="both")
    assert summary["sessions"] == 2 and summary["calls"] == sum(len(s.calls) for s in sessions)
    again = pc.load(out, task_id=task_id)
    check_against_rows(again, jsonl_rows(stack.export, task_id))
    # Another builder over the same calls: one trace per call.
    per_call = out / "per-request"
    pc.rederive(stack.export, per_call, builder="per_request", task_ids=[task_id])
    assert len(pc.load(per_call, task_id=task_id)) == sum(len(s.calls) for s in sessions)


def test_calls_in_s3_are_loaded_and_rederived(s3_stack: Stack, moto: Moto, task_id: str, tmp_path: Path) -> None:
    # The gateway uploads each session's calls file beside its trajectory;
    # both readers take them from the store with no node involved.
    client = pc.Client(s3_stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN)
    client.submit(task(task_id, 1))
    t = client.wait(task_id, timeout=120)
    check_done(t, 1)
    s3 = moto.s3()
    sessions = pc.load_calls(S3_EXPORT, task_id=task_id, s3=s3)
    assert [s.session_id for s in sessions] == [t.samples[0].session_id]
    assert sessions[0].calls and all(c.response is not None for c in sessions[0].calls)
    result = t.samples[0].result
    assert result is not None and result.stats is not None
    assert result.stats["calls_uri"] == f"{S3_EXPORT}/task={task_id}/{t.samples[0].session_id}.calls.jsonl.zst"
    out = tmp_path / "rederived"
    summary = pc.rederive(S3_EXPORT, out, task_ids=[task_id], formats="both", s3=s3)
    assert summary["sessions"] == 1
    check_against_rows(pc.load(out, task_id=task_id), jsonl_rows(S3_EXPORT, task_id, s3))


def calls_file(tmp: Path, header: dict[str, object], lines: list[bytes]) -> Path:
    text = json.dumps(header).encode() + b"\n" + b"".join(lines)
    path = tmp / "s.calls.jsonl.zst"
    path.write_bytes(pa.compress(text, codec="zstd", asbytes=True))
    return path


def test_damaged_and_newer_calls_files_are_refused(tmp_path: Path) -> None:
    header = {"polar_calls": 1, "session_id": "s", "task_id": None, "calls": 0, "session": None}
    good = calls_file(tmp_path, header, [])
    assert pc.read_calls(str(good)).calls == ()
    data = good.read_bytes()
    cut = tmp_path / "cut.calls.jsonl.zst"
    cut.write_bytes(data[: len(data) - 3])
    with pytest.raises(pc.TrajectoryError, match=r"cut\.calls\.jsonl\.zst: truncated or corrupt zstd stream"):
        pc.read_calls(str(cut))
    foreign = tmp_path / "x.parquet"
    foreign.write_bytes(b"PAR1\x00\x00")
    with pytest.raises(pc.TrajectoryError, match=r"x\.parquet: not a Polar calls file: no zstd frame at byte offset 0"):
        pc.read_calls(str(foreign))
    newer = calls_file(tmp_path, {**header, "polar_calls": 2}, [])
    with pytest.raises(pc.TrajectoryError, match="schema version 2 is newer"):
        pc.read_calls(str(newer))
    bad = calls_file(tmp_path, {**header, "calls": 1}, [b'{"not": "a record"}\n'])
    with pytest.raises(pc.TrajectoryError, match=r"line 2 \(decompressed byte offset \d+\) is not a call record"):
        pc.read_calls(str(bad))
