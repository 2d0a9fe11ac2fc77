"""The synchronous client against the real stack: submit, events, wait,
results, trajectories from the export directory and from S3, pause and
resume around a weight update, and the errors."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

import polar_client as pc
from helpers import check_against_rows, check_done, jsonl_rows
from stack import GATEWAY_TOKEN, S3_EXPORT, TRAINER_TOKEN, Moto, Stack, free_port, task


@pytest.fixture
def client(stack: Stack) -> pc.Client:
    return pc.Client(stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN)


def test_submit_follow_events_wait_and_load(stack: Stack, client: pc.Client, task_id: str) -> None:
    with client.events(task_id=task_id) as stream:
        sub = client.submit(task(task_id, 3))
        assert sub.task_id == task_id
        assert sub.session_ids == tuple(f"{task_id}-s{i}" for i in range(3))
        seen: list[pc.Event] = []
        for ev in stream:
            seen.append(ev)
            if ev.type == "task" and ev.data["status"] == "completed":
                break
    assert all(ev.task_id == task_id for ev in seen)
    ids = [ev.id for ev in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    done = {ev.data["session_id"] for ev in seen if ev.type == "session" and ev.data["state"] == "done"}
    assert done == set(sub.session_ids)
    # Each session went through the gateway's stages before its result.
    stages = {ev.data.get("stage") for ev in seen if ev.type == "session" and ev.data["state"] == "running"}
    assert "running" in stages

    t = client.wait(task_id, timeout=120)
    check_done(t, 3)
    assert t.group_id == f"group-{task_id}" and t.policy_version == "w-1"

    traces = pc.load_task(t)
    check_against_rows(traces, jsonl_rows(stack.export, task_id))
    assert {tr.session_id for tr in traces} == set(sub.session_ids)
    for tr in traces:
        assert tr.group_id == f"group-{task_id}" and tr.policy_version == "w-1" and tr.reward == 1.0
        assert tr.chain_role == "main" and len(tr.prompt_ids) > 0
        # Each session ran once, on the rollout path: its first attempt.
        assert tr.attempt == 1
        assert int(tr.loss_mask.sum()) > 0 and len(tr.loss_mask) == len(tr.response_ids)
    # The export root, with the task's partition, reads the same rows.
    by_dir = pc.load(stack.export, task_id=task_id)
    assert sorted(x.trace_id for x in by_dir) == sorted(x.trace_id for x in traces)
    assert len(pc.select(traces, policy_versions=["w-1"])) == len(traces)
    assert pc.select(traces, policy_versions=["w-0"]) == []
    assert [s.sample_index for s in client.task(task_id).samples] == [0, 1, 2]
    assert any(x.task_id == task_id for x in client.tasks(status="completed"))


def test_trajectories_from_s3(s3_stack: Stack, moto: Moto, task_id: str) -> None:
    # The gateway itself uploads each session's files to the S3-compatible
    # store; the client reads them back by each sample's URI and by prefix.
    client = pc.Client(s3_stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN)
    client.submit(task(task_id, 2))
    t = client.wait(task_id, timeout=120)
    check_done(t, 2)
    s3 = moto.s3()
    assert all(s.result is not None and str(s.result.trajectory_uri).startswith(f"{S3_EXPORT}/") for s in t.samples)
    traces = pc.load_task(t, s3=s3)
    check_against_rows(traces, jsonl_rows(S3_EXPORT, task_id, s3))
    assert {tr.session_id for tr in traces} == {s.session_id for s in t.samples}
    by_prefix = pc.load(S3_EXPORT, task_id=task_id, s3=s3)
    assert sorted(x.trace_id for x in by_prefix) == sorted(x.trace_id for x in traces)
    with pytest.raises(pc.TrajectoryError, match="no such file"):
        pc.load(f"{S3_EXPORT}-missing", task_id=task_id, s3=s3)


def gateway_status(stack: Stack) -> dict[str, object]:
    r = httpx.get(f"{stack.gateway}/v1/status", headers={"authorization": f"Bearer {GATEWAY_TOKEN}"}, timeout=10)
    r.raise_for_status()
    body: dict[str, object] = r.json()
    return body


def test_pause_and_resume_with_a_new_policy_version(stack: Stack, client: pc.Client, task_id: str) -> None:
    assert client.pause() == ["client-node"]
    try:
        assert gateway_status(stack)["paused"] is True
        client.submit(task(task_id, 1, policy_version="w-1"))
        # The session is prepared and waits in READY while generation is paused.
        deadline = time.monotonic() + 60
        while True:
            s = client.task(task_id).samples[0]
            if s.state == "running" and s.raw.get("stage") == "ready":
                break
            assert s.state in ("pending", "dispatched", "running"), s
            assert time.monotonic() < deadline, f"not held in READY: {s}"
            time.sleep(0.2)
    finally:
        resumed = client.resume("w-2")
    assert [(r.node_id, r.policy_version) for r in resumed] == [("client-node", "w-2")]
    assert gateway_status(stack)["paused"] is False
    t = client.wait(task_id, timeout=120)
    check_done(t, 1)
    traces = pc.load_task(t)
    # Every call ran after the resume: stamped with the new version.
    assert traces and all(tr.policy_version == "w-2" for tr in traces)
    assert all(tr.version_mask("w-2").tolist() == tr.loss_mask.tolist() for tr in traces)
    assert pc.select(traces, policy_versions=["w-1"]) == []


def test_paused_block_resumes_even_when_it_raises(stack: Stack, client: pc.Client) -> None:
    with pytest.raises(RuntimeError):
        with client.paused("w-9"):
            assert gateway_status(stack)["paused"] is True
            raise RuntimeError("the weight update failed")
    assert gateway_status(stack)["paused"] is False


def test_errors_carry_the_servers_message(stack: Stack, client: pc.Client, task_id: str) -> None:
    with pytest.raises(pc.Unauthorized) as bad:
        pc.Client(stack.server, "not-the-token").task("x")
    assert bad.value.status == 401 and bad.value.code == "unauthorized" and bad.value.message

    with pytest.raises(pc.NotFound) as unknown:
        client.task("no-such-task")
    assert unknown.value.code == "not_found" and "no-such-task" in unknown.value.message

    with pytest.raises(pc.InvalidRequest) as invalid:
        client.submit({**task(task_id, 1), "num_samples": 0})
    assert invalid.value.field == "num_samples"
    assert "num_samples" in invalid.value.message

    with pytest.raises(pc.InvalidRequest) as typo:
        client.submit({**task(task_id, 1), "num_sample": 1})
    assert "num_sample" in typo.value.message

    with pytest.raises(pc.Unauthorized):
        # The trainer token is not the gateways'.
        pc.Client(stack.server, TRAINER_TOKEN, gateway_token=TRAINER_TOKEN).pause()

    with pytest.raises(pc.PolarError, match="gateway token"):
        pc.Client(stack.server, TRAINER_TOKEN).pause()

    with pytest.raises(pc.Unauthorized):
        pc.Client(stack.server, "not-the-token").events()

    down = pc.Client(f"http://127.0.0.1:{free_port()}", TRAINER_TOKEN, timeout=5)
    with pytest.raises(pc.ServerUnavailable) as no_server:
        down.status()
    assert "127.0.0.1" in no_server.value.url and no_server.value.reason
    with pytest.raises(pc.ServerUnavailable):
        down.events()


def test_duplicate_unfinished_and_cancel(stack: Stack, client: pc.Client, task_id: str) -> None:
    client.submit(task(task_id, 1, sleep=30))
    with pytest.raises(pc.Conflict) as dup:
        client.submit(task(task_id, 1))
    assert dup.value.code == "duplicate_task"
    with pytest.raises(pc.Conflict) as busy:
        client.delete(task_id)
    assert busy.value.code == "task_not_finished"
    client.cancel(task_id)
    t = client.wait(task_id, timeout=60)
    assert t.status == "cancelled"
    client.delete(task_id)
    with pytest.raises(pc.NotFound):
        client.task(task_id)


def test_wait_times_out_with_the_last_view(stack: Stack, client: pc.Client, task_id: str) -> None:
    client.submit(task(task_id, 1, sleep=30))
    try:
        with pytest.raises(pc.TaskTimeout) as late:
            client.wait(task_id, timeout=2)
        assert late.value.task is not None and late.value.task["task_id"] == task_id
    finally:
        client.cancel(task_id)


def test_wait_follows_the_task_across_a_server_restart(stack: Stack, client: pc.Client, task_id: str) -> None:
    client.submit(task(task_id, 2, sleep=4))
    result: dict[str, pc.Task] = {}
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            result["task"] = client.wait(task_id, timeout=180)
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    deadline = time.monotonic() + 60
    while client.task(task_id).status != "running":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # The waiter's stream breaks; the server comes back with the task (its
    # event ids start again from 1) and the sessions' results still arrive.
    stack.restart_rollout()
    waiter.join(200)
    assert not errors, errors
    check_done(result["task"], 2)


def test_a_pause_that_fails_on_one_node_leaves_none_paused(stack: Stack, client: pc.Client) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(pc.ServerUnavailable) as e:
        client.pause(nodes=[stack.gateway, dead])
    assert e.value.url.startswith(dead)
    assert gateway_status(stack)["paused"] is False
