"""The NeMo Gym bridge, driven as NeMo Gym's rollout collection drives an
agent server: nemo-gym 0.4.0's own server classes (the agent is built as
``run_webserver`` builds it: its config model, a ``ServerClient``, the
FastAPI app with its liveness route, served by uvicorn on loopback), rows
posted to ``/run`` through ``ServerClient.post`` as
``RolloutCollectionHelper.run_examples`` posts them, the replies read with
its ``raise_for_status``/``get_response_json`` and validated as its
``BaseVerifyResponse``; against the real stack, every reply checked
against Polar's exported Parquet, and its calls checked to chain token for
token as a trainer flattening them (NeMo RL) needs."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator

import pytest
import uvicorn
from nemo_gym.base_resources_server import BaseVerifyResponse
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import (
    GlobalAIOHTTPAsyncClientConfig,
    ServerClient,
    get_response_json,
    is_global_aiohttp_client_setup,
    raise_for_status,
    set_global_aiohttp_client,
)
from omegaconf import OmegaConf

import polar_client as pc
from polar_client.bridges.nemo_gym import PolarAgent, PolarAgentConfig
from stack import TRAINER_TOKEN, Stack, free_port, task_template

AGENT = "polar_agent"


@pytest.fixture(scope="module")
def server_client(stack: Stack) -> Iterator[ServerClient]:
    port = free_port()
    global_config = OmegaConf.create(
        {AGENT: {"responses_api_agents": {"polar": {"host": "127.0.0.1", "port": port, "entrypoint": "app.py"}}}}
    )
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=free_port()),
                          global_config_dict=global_config)
    template = task_template()
    config = PolarAgentConfig(
        host="127.0.0.1", port=port, entrypoint="app.py", name=AGENT,
        polar_server=stack.server, polar_token=TRAINER_TOKEN, task=template, wait_secs=180,
    )
    agent = PolarAgent(config=config, server_client=client)
    app = agent.setup_webserver()
    agent.setup_liveness(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the agent server did not start"
        time.sleep(0.05)
    try:
        yield client
    finally:
        server.should_exit = True
        thread.join(10)


async def collect(client: ServerClient, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not is_global_aiohttp_client_setup():
        set_global_aiohttp_client(cfg=GlobalAIOHTTPAsyncClientConfig.model_validate({}))

    async def post(row: dict[str, Any]) -> dict[str, Any]:
        res = await client.post(server_name=row["agent_ref"]["name"], url_path="/run", json=row)
        await raise_for_status(res)
        body: dict[str, Any] = await get_response_json(res)
        return body

    return await asyncio.gather(*(post(r) for r in rows))


def test_rollout_rows_through_the_polar_agent(stack: Stack, server_client: ServerClient) -> None:
    rows = [
        {
            "responses_create_params": {"input": [{"role": "user", "content": "Create the file polar-demo.txt."}]},
            "agent_ref": {"name": AGENT},
            "group_id": f"gym-group-{i // 2}",
            "row_index": i,
        }
        for i in range(3)
    ]
    replies = asyncio.run(collect(server_client, rows))
    for row, reply in zip(rows, replies):
        verified = BaseVerifyResponse.model_validate(reply)
        # The row's own fields come back, as the agents of NeMo Gym return them.
        assert reply["row_index"] == row["row_index"] and reply["group_id"] == row["group_id"]
        meta = verified.response.metadata
        session = meta["polar_session_id"]
        [t] = [x for x in pc.load(stack.export, task_id=session.rsplit("-s", 1)[0]) if x.trace_id == meta["polar_trace_id"]]
        assert t.group_id == row["group_id"] and t.chain_role == "main"
        assert verified.reward == t.reward == 1.0
        assert meta["polar_policy_version"] == (t.policy_version or "")
        # The calls chain: each call's prompt is everything before its
        # generation; together they are the trace's tokens and its mask.
        items = reply["response"]["output"]
        spans = t.trace_metadata["spans"]
        assert len(items) == len(spans) >= 2
        full = t.prompt_ids.tolist() + t.response_ids.tolist()
        trained = [0] * len(t.prompt_ids) + t.loss_mask.tolist()
        covered = [0] * len(full)
        assert t.logprobs is not None
        lps = [0.0] * len(t.prompt_ids) + t.logprobs.tolist()
        for item in items:
            assert item["role"] == "assistant" and item["type"] == "message"
            p, g = item["prompt_token_ids"], item["generation_token_ids"]
            assert full[: len(p)] == p and full[len(p) : len(p) + len(g)] == g
            assert item["generation_log_probs"] == lps[len(p) : len(p) + len(g)]
            for k in range(len(p), len(p) + len(g)):
                covered[k] = 1
        assert covered == trained
