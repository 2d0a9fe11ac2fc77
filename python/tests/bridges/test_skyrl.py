"""The SkyRL bridge, driven as SkyRL's trainer drives a generator:
skyrl-train 0.3.1's own config (``ppo_base_config.yaml`` through Hydra), a
``PromptDataset`` read from a file and its dataloader, ``RayPPOTrainer``'s
``generate`` (which validates the output) and
``postprocess_generator_output``, then the tensors its
``convert_to_training_input`` builds
(``convert_prompts_responses_to_batch_tensors``); against the real stack,
every row checked field by field against Polar's exported Parquet."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import skyrl_train
import torch
from hydra import compose, initialize_config_dir
from skyrl_train.dataset import PromptDataset
from skyrl_train.dataset.preprocess import convert_prompts_responses_to_batch_tensors
from skyrl_train.generators.utils import prepare_generator_input
from skyrl_train.trainer import RayPPOTrainer
from transformers import AutoTokenizer

import polar_client as pc
from polar_client.bridges.skyrl import PolarGenerator
from stack import GATEWAY_TOKEN, TRAINER_TOKEN, Stack, task_template
from tiny_model import tiny_model

N_SAMPLES = 2


@pytest.fixture(scope="module")
def trainer(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> RayPPOTrainer:
    dir = tmp_path_factory.mktemp("skyrl")
    tiny_model(dir / "model")
    data = dir / "train.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": "Create the file polar-demo.txt."}], "env_class": "polar"},
        {"prompt": [{"role": "user", "content": "Create the file polar-demo.txt, please."}], "env_class": "polar"},
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config_dir = os.path.join(os.path.dirname(skyrl_train.__file__), "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose(
            config_name="ppo_base_config",
            overrides=[
                f"trainer.policy.model.path={dir / 'model'}",
                "trainer.train_batch_size=2",
                f"generator.n_samples_per_prompt={N_SAMPLES}",
                f"data.train_data=['{data}']",
            ],
        )
    tokenizer = AutoTokenizer.from_pretrained(dir / "model")
    dataset = PromptDataset([str(data)], tokenizer, max_prompt_length=512, num_workers=1)
    template = task_template()
    generator = PolarGenerator(
        stack.server, TRAINER_TOKEN, task=template, wait_secs=180, gateway_token=GATEWAY_TOKEN, policy_version="w-1"
    )
    return RayPPOTrainer(
        cfg=cfg,
        tracker=None,
        tokenizer=tokenizer,
        train_dataset=dataset,
        inference_engine_client=None,
        generator=generator,
    )


def test_training_steps_through_polar(stack: Stack, trainer: RayPPOTrainer) -> None:
    assert {t.policy_version for t in step(stack, trainer, 1)} == {"w-1"}
    # SkyRL's weight sync, wrapped: generation paused, resumed naming the
    # new version, which the next step's tasks carry.
    with trainer.generator.weight_update("w-2"):
        pass
    traces = step(stack, trainer, 2)
    assert {t.policy_version for t in traces} == {"w-2"}
    assert pc.select(traces, policy_versions=["w-1"]) == []


def step(stack: Stack, trainer: RayPPOTrainer, global_step: int) -> list[pc.Trace]:
    """One step of SkyRL's training loop up to its training input; each
    row checked against the Parquet trace it came from, which are returned."""
    prompts = next(iter(trainer.train_dataloader))
    generator_input, uids = prepare_generator_input(prompts, N_SAMPLES, {}, "polar", "train", global_step)
    out = asyncio.run(trainer.generate(generator_input))
    assert out["trajectory_ids"] == generator_input["trajectory_ids"]
    out = trainer.postprocess_generator_output(out, uids)
    seqs, attn, action_mask, rewards, loss_masks, logprobs = convert_prompts_responses_to_batch_tensors(
        trainer.tokenizer,
        out["prompt_token_ids"],
        out["response_ids"],
        out["rewards"],
        out["loss_masks"],
        out["rollout_logprobs"],
    )
    assert logprobs is not None
    n = len(uids)
    assert n == 2 * N_SAMPLES and seqs.shape[0] == n
    groups = [f"train-{global_step}/{u}" for u in uids]
    traces = {t.trace_id: t for t in pc.load(stack.export) if t.group_id in set(groups)}
    # One main trace per session; rows in the batch's order, a group per uid.
    sessions = sorted({t.session_id for t in traces.values()})
    assert len(sessions) == n
    P = max(len(p) for p in out["prompt_token_ids"])
    used: list[pc.Trace] = []
    for i in range(n):
        prompt, response = out["prompt_token_ids"][i], out["response_ids"][i]
        [t] = [t for t in traces.values() if t.prompt_ids.tolist() == prompt and t.response_ids.tolist() == response
               and t.group_id == groups[i] and t.session_id.endswith(f"-s{generator_input['trajectory_ids'][i].repetition_id}")]
        used.append(t)
        r = len(response)
        assert t.chain_role == "main" and t.segment == 0
        assert seqs[i, P - len(prompt) : P].tolist() == t.prompt_ids.tolist()
        assert seqs[i, P : P + r].tolist() == t.response_ids.tolist()
        assert attn[i, : P - len(prompt)].sum() == 0
        assert loss_masks[i, :r].tolist() == [float(m) for m in t.loss_mask.tolist()]
        assert action_mask[i, :r].sum() == r
        assert t.logprobs is not None
        assert torch.equal(logprobs[i, :r], torch.from_numpy(t.logprobs.copy()))
        # The outcome reward on the last response token.
        assert rewards[i, r - 1].item() == t.reward == 1.0 and rewards[i].sum().item() == 1.0
        assert out["stop_reasons"][i] == t.finish_reason
    assert out["rollout_metrics"]["polar/sessions"] == n
    # Every session's main chain whole in its one sample.
    assert out["rollout_metrics"]["polar/split_sessions"] == 0
    assert out["rollout_metrics"]["polar/untrained_tokens"] == 0
    assert all(len(t.trace_metadata["spans"]) >= 2 for t in used)
    return used
