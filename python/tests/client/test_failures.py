"""Failures reach the trainer: a task with no usable sample raises
[`TaskFailed`] from ``wait()`` and ``load_task()`` (or warns, by the
``failures`` parameter) with its failures grouped; a partial one warns; no
unusable sample carries a reward; advantages leave unrewarded traces out."""

from __future__ import annotations

import asyncio
import dataclasses
import warnings

import numpy as np
import pytest

import polar_client as pc
from polar_client import outcome
from stack import TRAINER_TOKEN, Stack, task

UNSCORED = "evaluation failed: reward file .polar/reward: not found in the workspace (the command exited with 0)"


def unscorable(task_id: str, n: int) -> dict[str, object]:
    """A task whose evaluator never writes its reward file: every sample errors."""
    body = task(task_id, n)
    body["evaluator"] = {"kind": "command", "options": {"command": "true", "reward": "file"}}
    return body


def test_a_task_without_a_usable_sample_raises_with_its_failures_grouped(stack: Stack, task_id: str) -> None:
    with pc.Client(stack.server, TRAINER_TOKEN) as client:
        client.submit(unscorable(task_id, 2))
        with pytest.raises(pc.TaskFailed) as err:
            client.wait(task_id, timeout=300)
        text = str(err.value)
        assert text.splitlines() == [
            f"task {task_id} ended failed: 0 of 2 requested samples usable",
            f"  2 samples error: {UNSCORED} (samples 0, 1)",
        ], text
        t = err.value.task
        assert t.status == "failed" and t.usable == 0 and t.requested == 2
        assert t.mean_reward is None
        assert [(g.status, g.error, g.count, g.samples) for g in t.failures] == [("error", UNSCORED, 2, (0, 1))]
        # No unusable sample has a reward.
        assert all(s.result is not None and s.result.status == "error" and s.result.reward is None for s in t.samples)
        # Warn: the task comes back, with the same text as a warning.
        with pytest.warns(pc.UnusableSamples, match="0 of 2 requested samples usable"):
            again = client.wait(task_id, timeout=30, failures="warn")
        assert again.status == "failed"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert client.wait(task_id, timeout=30, failures="ignore").status == "failed"
        with pytest.raises(pc.TaskFailed, match="ended failed"):
            pc.load_task(again)
        # Its traces (labelled faults, without a reward) when asked for.
        with pytest.warns(pc.UnusableSamples):
            traces = pc.load_task(again, failures="warn")
        assert traces and all(t.faulty and t.reward is None for t in traces)
        assert pc.select(traces) == []
        with pytest.raises(ValueError, match="failures='loud': must be one of 'raise', 'warn', 'ignore'"):
            client.wait(task_id, failures="loud")  # type: ignore[arg-type]


def test_the_async_client_raises_the_same(stack: Stack, task_id: str) -> None:
    async def run() -> None:
        async with pc.AsyncClient(stack.server, TRAINER_TOKEN) as client:
            await client.submit(unscorable(task_id, 1))
            with pytest.raises(pc.TaskFailed, match=f"task {task_id} ended failed: 0 of 1 requested samples usable"):
                await client.wait(task_id, timeout=300)
            with pytest.warns(pc.UnusableSamples):
                t = await client.wait(task_id, timeout=30, failures="warn")
            assert t.failures[0].count == 1

    asyncio.run(run())


def _task(status: str, usable: int, requested: int, failures: list[dict[str, object]]) -> pc.Task:
    return pc.Task.of({
        "task_id": "t", "status": status, "group_id": "g", "num_samples": requested, "requested": requested,
        "counts": {"usable": usable}, "failures": failures,
    })


def test_a_partial_task_warns_unless_ignored() -> None:
    timeout = {"status": "timeout", "error": "the session's time ran out", "count": 1, "samples": [3]}
    t = _task("partial", 3, 4, [timeout])
    expected = "task t ended partial: 3 of 4 requested samples usable\n  1 sample timeout: the session's time ran out (sample 3)"
    assert outcome.summary(t) == expected
    for mode in ("raise", "warn"):
        with pytest.warns(pc.UnusableSamples) as w:
            assert outcome.check(t, mode) is t  # type: ignore[arg-type]
        assert str(w[0].message) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        outcome.check(t, "ignore")
        outcome.check(_task("completed", 4, 4, []), "raise")
        outcome.check(_task("cancelled", 0, 4, []), "raise")
        outcome.check(_task("running", 0, 4, []), "raise")


def test_long_failure_groups_are_cut() -> None:
    g = pc.FailureGroup.of({"status": "failed", "error": "no healthy node for 30000 ms", "count": 12, "samples": list(range(12))})
    assert str(g) == "12 samples failed: no healthy node for 30000 ms (samples 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... 2 more)"


def test_traces_without_a_reward_stay_out_of_the_advantages(stack: Stack, task_id: str) -> None:
    with pc.Client(stack.server, TRAINER_TOKEN) as client:
        client.submit(task(task_id, 2))
        traces = pc.load_task(client.wait(task_id, timeout=300))
    mains = [t for t in traces if t.chain_role == "main" and t.segment == 0]
    assert len(mains) == 2
    a, b = mains
    rewarded = [dataclasses.replace(a, reward=1.0), dataclasses.replace(b, reward=0.0)]
    unrewarded = dataclasses.replace(b, reward=None, session_id="other", trace_id="other")
    adv = pc.advantages([*rewarded, unrewarded])
    # The unrewarded trace gets 0 and does not move the group's mean (0.5).
    assert adv[2] == 0.0
    assert np.allclose(adv[:2], [1.0, -1.0], atol=1e-4)


def test_load_reads_jsonl_as_parquet_and_select_refuses_unknown_roles(stack: Stack, task_id: str) -> None:
    with pc.Client(stack.server, TRAINER_TOKEN) as client:
        client.submit(task(task_id, 1))
        t = client.wait(task_id, timeout=300)
    uri = t.samples[0].result.trajectory_uri if t.samples[0].result else None
    assert uri is not None and uri.endswith(".parquet"), t
    jsonl = uri[: -len(".parquet")] + ".jsonl"
    from_parquet = pc.load(uri)
    from_jsonl = pc.load(jsonl)
    assert from_parquet and len(from_jsonl) == len(from_parquet)
    for a, b in zip(from_parquet, from_jsonl):
        assert (a.trace_id, a.reward, a.chain_role, a.labels) == (b.trace_id, b.reward, b.chain_role, b.labels)
        assert a.prompt_ids.tolist() == b.prompt_ids.tolist()
        assert a.response_ids.tolist() == b.response_ids.tolist()
        assert a.loss_mask.tolist() == b.loss_mask.tolist()
        assert a.trace_metadata == b.trace_metadata
    with pytest.raises(ValueError, match="unknown chain role 'mian': one of main, sub_agent, side"):
        pc.select(from_parquet, roles=["mian"])
    with pytest.raises(ValueError, match=r"roles='main': a sequence of roles, e\.g\. \['main'\]"):
        pc.select(from_parquet, roles="main")
    assert pc.select(from_parquet, roles=["main"]) == [x for x in from_parquet if x.chain_role == "main"]
