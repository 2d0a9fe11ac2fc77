"""The verl bridge, driven as verl drives it: verl 0.9.1's own trainer
config (``ppo_trainer.yaml`` through Hydra), its ``AgentLoopWorker`` (which
reads ``agent_loop_config_path`` and instantiates the loop with Hydra), a
``DataProto`` batch repeated per GRPO sample as verl's trainer does, and
``generate_sequences``; against the real stack, with every output row
checked field by field against Polar's exported Parquet."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

import polar_client as pc
from polar_client.bridges.verl import weight_update
from stack import GATEWAY_TOKEN, TRAINER_TOKEN, Stack, task_template
from tiny_model import tiny_model

PROMPT_LENGTH = 2048
RESPONSE_LENGTH = 2048


@pytest.fixture(scope="module")
def worker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AgentLoopWorker:
    dir = tmp_path_factory.mktemp("verl")
    tiny_model(dir / "model")
    template = task_template()
    loops = [
        {
            "name": "polar",
            "_target_": "polar_client.bridges.verl.PolarAgentLoop",
            "server": stack.server,
            "token": TRAINER_TOKEN,
            "task": template,
            "wait_secs": 180,
        }
    ]
    (dir / "agent_loops.yaml").write_text(json.dumps(loops))  # JSON is YAML
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer/config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={dir / 'model'}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
                f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={dir / 'agent_loops.yaml'}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=polar",
            ],
        )
    # The rollout worker verl's AgentLoopManager runs as a Ray actor; the
    # Polar loop does not use the LLM server client (Polar calls the model).
    return AgentLoopWorker(cfg, llm_client=None)


def gen_batch(prompts: list[str], n: int) -> DataProto:
    """What verl's trainer hands the rollout: one row per prompt with a
    fresh ``uid``, repeated ``n`` times (interleaved) for GRPO."""
    raw = np.empty(len(prompts), dtype=object)
    raw[:] = [[{"role": "user", "content": p}] for p in prompts]
    batch = DataProto.from_dict(
        tensors={"dummy": torch.zeros(len(prompts), 1)},
        non_tensors={
            "raw_prompt": raw,
            "uid": np.array([str(uuid.uuid4()) for _ in prompts], dtype=object),
            "index": np.arange(len(prompts)),
            "extra_info": np.array([{"index": i} for i in range(len(prompts))], dtype=object),
        },
    )
    return batch.repeat(repeat_times=n, interleave=True)


def check_output(out: DataProto, batch: DataProto, export: Path) -> list[pc.Trace]:
    """Each output row equals the Parquet trace it names, field by field."""
    b = out.batch
    n = len(batch)
    assert b["prompts"].shape == (n, PROMPT_LENGTH) and b["responses"].shape == (n, RESPONSE_LENGTH)
    traces = []
    for i in range(n):
        session = out.non_tensor_batch["polar_session_id"][i]
        task_id = session.rsplit("-s", 1)[0]
        rows = pc.load(export, task_id=task_id)
        t = next(r for r in rows if r.trace_id == out.non_tensor_batch["polar_trace_id"][i])
        traces.append(t)
        p, r = len(t.prompt_ids), len(t.response_ids)
        assert 0 < p <= PROMPT_LENGTH and 0 < r <= RESPONSE_LENGTH
        # Prompts left-padded, responses right-padded, as verl lays them out.
        assert b["prompts"][i, PROMPT_LENGTH - p :].tolist() == t.prompt_ids.tolist()
        assert b["attention_mask"][i, : PROMPT_LENGTH - p].sum() == 0
        assert b["responses"][i, :r].tolist() == t.response_ids.tolist()
        assert b["response_mask"][i, :r].tolist() == t.loss_mask.tolist()
        assert b["response_mask"][i, r:].sum() == 0
        assert t.logprobs is not None
        assert torch.equal(b["rollout_log_probs"][i, :r], torch.from_numpy(t.logprobs.copy()))
        assert b["input_ids"][i].tolist() == b["prompts"][i].tolist() + b["responses"][i].tolist()
        # The reward on the last response token.
        assert b["rm_scores"][i, r - 1].item() == t.reward == 1.0
        assert b["rm_scores"][i].sum().item() == 1.0
        # The GRPO group is verl's uid.
        assert t.group_id == batch.non_tensor_batch["uid"][i]
        assert out.non_tensor_batch["polar_chain_role"][i] == "main"
        # The whole main chain, every call of it, in the one sample.
        assert len(t.trace_metadata["spans"]) >= 2
        assert out.non_tensor_batch["polar_chain_segments"][i] == 1
        assert out.non_tensor_batch["polar_untrained_tokens"][i] == 0
    return traces


def test_generate_sequences_through_polar(stack: Stack, worker: AgentLoopWorker) -> None:
    batch = gen_batch(["Create the file polar-demo.txt.", "Create the file polar-demo.txt, please."], n=2)
    out = asyncio.run(worker.generate_sequences(batch))
    traces = check_output(out, batch, stack.export)
    assert len({t.session_id for t in traces}) == 4
    # Rows 0 and 1 are one prompt's group, 2 and 3 the other's.
    uids = batch.non_tensor_batch["uid"]
    assert uids[0] == uids[1] != uids[2] == uids[3]
    assert out.non_tensor_batch["uid"].tolist() == uids.tolist()


def test_weight_update_stamps_the_new_version(stack: Stack, worker: AgentLoopWorker) -> None:
    client = pc.Client(stack.server, TRAINER_TOKEN, gateway_token=GATEWAY_TOKEN)
    batch = gen_batch(["Create the file polar-demo.txt."], n=2)
    result: dict[str, DataProto] = {}
    with weight_update(client, "w-7"):
        # verl's rollout runs while the update is in progress: its sessions
        # are prepared and held before their first model call.
        thread = threading.Thread(target=lambda: result.update(out=asyncio.run(worker.generate_sequences(batch))))
        thread.start()
        deadline = time.monotonic() + 60
        while True:
            held = [s for t in client.tasks(status="running") for s in client.task(t.task_id).samples
                    if s.raw.get("stage") == "ready"]
            if len(held) == 2:
                break
            assert time.monotonic() < deadline, "the sessions were not held in READY"
            time.sleep(0.2)
    thread.join(180)
    traces = check_output(result["out"], batch, stack.export)
    assert [t.policy_version for t in traces] == ["w-7", "w-7"]
    assert result["out"].non_tensor_batch["polar_policy_version"].tolist() == ["w-7", "w-7"]
