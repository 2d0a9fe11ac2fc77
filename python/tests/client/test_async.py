"""The asyncio client against the real stack: the same calls as the
synchronous one, concurrently."""

from __future__ import annotations

import asyncio

import pytest

import polar_client as pc
from helpers import check_against_rows, check_done, jsonl_rows
from stack import GATEWAY_TOKEN, TRAINER_TOKEN, Stack, free_port, task


@pytest.mark.asyncio
async def test_two_groups_concurrently(stack: Stack, task_id: str) -> None:
    async with pc.AsyncClient(stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN) as client:
        ids = [f"{task_id}-a", f"{task_id}-b"]
        stream = await client.events()
        async with stream:
            for i in ids:
                await client.submit(task(i, 2, group_id=f"g-{i}"))
            finished: set[str] = set()
            async for ev in stream:
                if ev.type == "task" and ev.data["status"] == "completed" and ev.task_id in ids:
                    finished.add(ev.data["task_id"])
                if finished == set(ids):
                    break
        views = await asyncio.gather(*(client.wait(i, timeout=120) for i in ids))
        for i, t in zip(ids, views):
            check_done(t, 2)
            traces = pc.load_task(t)
            check_against_rows(traces, jsonl_rows(stack.export, i))
            assert {x.group_id for x in traces} == {f"g-{i}"}
        assert {n.node_id for n in await client.nodes()} == {"client-node"}
        assert (await client.status())["nodes"]


@pytest.mark.asyncio
async def test_pause_resume_and_errors(stack: Stack, task_id: str) -> None:
    async with pc.AsyncClient(stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN) as client:
        async with client.paused("w-5"):
            pass
        with pytest.raises(pc.NotFound) as unknown:
            await client.task("no-such-task")
        assert "no-such-task" in unknown.value.message
        with pytest.raises(pc.InvalidRequest) as invalid:
            await client.submit({**task(task_id, 1), "timeout_secs": 0})
        assert invalid.value.field == "timeout_secs"
        await client.submit(task(task_id, 1, sleep=30))
        with pytest.raises(pc.TaskTimeout):
            await client.wait(task_id, timeout=1)
        await client.cancel(task_id)
        assert (await client.wait(task_id, timeout=60)).status == "cancelled"
    async with pc.AsyncClient(stack.server, "not-the-token") as bad:
        with pytest.raises(pc.Unauthorized) as e:
            await bad.tasks()
        assert e.value.status == 401
        with pytest.raises(pc.Unauthorized):
            await bad.events()
    async with pc.AsyncClient(f"http://127.0.0.1:{free_port()}", TRAINER_TOKEN) as down:
        with pytest.raises(pc.ServerUnavailable):
            await down.task("x")
