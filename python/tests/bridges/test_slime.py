"""The slime bridge, driven as slime drives a rollout function: loaded by
its path with slime's ``load_function`` (as ``--rollout-function-path`` is),
called through slime's ``call_rollout_fn`` with slime's own
``RolloutDataSource`` reading a prompt file with a tokenizer, like its
rollout manager; against the real stack, every sample checked against
Polar's exported Parquet.

slime is on no package registry this machine reaches, so ``cargo xtask
test`` does not run this: run it by hand in the verl environment (torch
and transformers, which slime's data path imports) with a checkout of
slime on ``PYTHONPATH`` (docs/TRAINERS.md)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
from slime.rollout.data_source import RolloutDataSource
from slime.utils.misc import load_function
from slime.utils.types import Sample

import polar_client as pc
from stack import TRAINER_TOKEN, Stack, task_template
from tiny_model import tiny_model


def test_a_rollout_step_through_polar(stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny_model(tmp_path / "model")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                               ["Create the file polar-demo.txt.", "Create the file polar-demo.txt, please."]))
    template = task_template()
    (tmp_path / "task.json").write_text(json.dumps(template))
    monkeypatch.setenv("POLAR_SERVER", stack.server)
    monkeypatch.setenv("POLAR_ROLLOUT_TOKEN", TRAINER_TOKEN)
    monkeypatch.setenv("POLAR_TASK_FILE", str(tmp_path / "task.json"))
    monkeypatch.setenv("POLAR_POLICY_VERSION", "w-3")
    args = Namespace(
        rollout_global_dataset=True, prompt_data=str(prompts), hf_checkpoint=str(tmp_path / "model"),
        dump_details=None, rollout_max_prompt_len=None, input_key="text", multimodal_keys=None, label_key=None,
        metadata_key="metadata", tool_key=None, apply_chat_template=False, apply_chat_template_kwargs={},
        rollout_seed=42, rollout_shuffle=False, n_samples_per_prompt=2, rollout_batch_size=2,
    )
    data_source = RolloutDataSource(args)
    fn = load_function("polar_client.bridges.slime.generate_rollout")
    out = call_rollout_fn(fn, args, 7, data_source, evaluation=False)
    assert isinstance(out, RolloutFnTrainOutput)
    assert [len(g) for g in out.samples] == [2, 2]
    for g, group in enumerate(out.samples):
        assert {s.group_index for s in group} == {group[0].group_index}
        for s in group:
            assert isinstance(s, Sample) and s.status == Sample.Status.COMPLETED
            task_id = s.session_id.rsplit("-s", 1)[0]
            [t] = [x for x in pc.load(stack.export, task_id=task_id) if x.trace_id == s.metadata["polar"]["trace_id"]]
            assert t.group_id == f"rollout-7/{group[0].group_index}" and t.policy_version == "w-3"
            assert s.tokens == t.prompt_ids.tolist() + t.response_ids.tolist()
            assert s.response_length == len(t.response_ids)
            assert s.loss_mask == t.loss_mask.tolist()
            assert t.logprobs is not None and s.rollout_log_probs == t.logprobs.tolist()
            assert s.reward == t.reward == 1.0
            assert s.weight_versions == ["w-3"]
            assert s.prompt == ["Create the file polar-demo.txt.", "Create the file polar-demo.txt, please."][g]
    assert out.metrics["polar/sessions"] == 4
    with pytest.raises(pc.PolarError, match="eval-function-path"):
        call_rollout_fn(fn, args, 8, data_source, evaluation=True)
