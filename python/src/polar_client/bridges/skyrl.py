"""SkyRL: Polar as a generator (``skyrl_train.generators.base.GeneratorInterface``).

SkyRL's trainer hands ``generate`` a batch of prompts, each repeated
``n_samples_per_prompt`` times with a ``TrajectoryID`` (``instance_id``: the
prompt's uid, ``repetition_id``: the sample). The generator submits one
Polar task per ``instance_id`` with one session per repetition (so a GRPO
group is a Polar task and its ``group_id`` the uid), waits for them all,
reads the sessions' exported trajectories and returns a ``GeneratorOutput``
in the batch's order, built from Polar's tokens: ``prompt_token_ids``,
``response_ids``, ``loss_masks``, ``rollout_logprobs``, ``rewards`` (one
per sample: the evaluator's), ``stop_reasons`` (each trace's
``finish_reason``). Tested against skyrl-train 0.3.1.

Construct it with the rollout server and a task template (the task
request's fields besides the instruction and the sample count) and give it
to SkyRL's trainer in place of its ``SkyRLGymGenerator`` (a custom
entrypoint's ``get_generator``)::

    PolarGenerator("http://rollout:7070", task={
        "timeout_secs": 1800,
        "agent": {"harness": "claude_code"},
        "evaluator": {"kind": "command", "options": {"command": "pytest -q"}},
    })

A session can yield several traces; SkyRL takes one sequence per sample,
so the generator returns the main chain's first segment (with
token-faithful serving, the whole main chain; the others are counted in
``rollout_metrics["polar/other_traces"]``). Sessions whose main chain has
several segments are counted in ``rollout_metrics["polar/split_sessions"]``,
the generated tokens left out in ``["polar/untrained_tokens"]``, and each
is logged as a warning naming the session. Around SkyRL's
weight sync, ``generator.weight_update(version)`` pauses generation on the
gateways and resumes naming the new version, which the tasks the generator
submits from then on carry too (``metadata.policy_version``), so every
trace says which weights it came from and stale ones can be filtered.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from skyrl_train.generators.base import GeneratorInput, GeneratorInterface, GeneratorOutput

from ..aio import AsyncClient
from ..client import Client
from ..errors import PolarError
from ..trajectories import Trace, load_task
from ..types import Task
from .common import chain_split, instruction_of, pick

log = logging.getLogger(__name__)

#: How long one batch may take by default.
DEFAULT_WAIT = 3600.0


class PolarGenerator(GeneratorInterface):  # type: ignore[misc]
    """Runs each GRPO group as a Polar task (see the module's doc)."""

    def __init__(
        self,
        server: str,
        token: str | None = None,
        *,
        task: Mapping[str, Any] | None = None,
        task_prefix: str = "skyrl",
        wait_secs: float = DEFAULT_WAIT,
        gateway_token: str | None = None,
        policy_version: str | None = None,
    ) -> None:
        self.server, self.token = server, token
        self.gateway_token = gateway_token
        #: Stamped on the tasks submitted (``metadata.policy_version``).
        self.policy_version = policy_version
        self.task_template = dict(task or {})
        self.task_prefix = task_prefix
        self.wait_secs = wait_secs

    def task_request(self, instruction: str, group: str, n: int, extras: Any) -> dict[str, Any]:
        """The task of one group of ``n`` samples."""
        body: dict[str, Any] = {
            "timeout_secs": 1800,
            "agent": {"harness": "shell"},
            **self.task_template,
            "task_id": f"{self.task_prefix}-{uuid.uuid4().hex[:24]}",
            "instruction": instruction,
            "num_samples": n,
        }
        metadata = dict(body.get("metadata") or {})
        metadata["group_id"] = group
        if self.policy_version is not None:
            metadata["policy_version"] = self.policy_version
        if isinstance(extras, Mapping) and extras:
            metadata.setdefault("extra", {}).update({"skyrl_env_extras": dict(extras)})
        body["metadata"] = metadata
        return body

    @contextmanager
    def weight_update(self, policy_version: str) -> Iterator[None]:
        """Around the trainer's weight sync: generation paused on every
        gateway (needs the gateways' token), resumed naming
        ``policy_version``, which later tasks carry too."""
        with Client(self.server, self.token, gateway_token=self.gateway_token) as client:
            with client.paused(policy_version):
                yield
        self.policy_version = policy_version

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        prompts = input_batch["prompts"]
        ids = input_batch.get("trajectory_ids")
        extras = input_batch.get("env_extras") or [None] * len(prompts)
        # Rows by group, in order: the k-th row of a group is its sample k.
        groups: dict[str, list[int]] = {}
        for row in range(len(prompts)):
            key = ids[row].instance_id if ids else f"row-{row}"
            groups.setdefault(key, []).append(row)
        requests = {
            key: self.task_request(
                instruction_of(prompts[rows[0]]), group_of(input_batch, key), len(rows), extras[rows[0]]
            )
            for key, rows in groups.items()
        }
        async with AsyncClient(self.server, self.token) as polar:
            for body in requests.values():
                await polar.submit(body)
            tasks = await asyncio.gather(
                *(polar.wait(body["task_id"], timeout=self.wait_secs) for body in requests.values())
            )
        loop = asyncio.get_running_loop()
        per_row: list[Trace | None] = [None] * len(prompts)
        others = split_sessions = untrained = 0
        for (key, rows), task in zip(groups.items(), tasks):
            # Reading Parquet blocks: off the event loop.
            traces = await loop.run_in_executor(None, load_task, task)
            for k, row in enumerate(rows):
                chosen, rest = pick(_of_session(task, k, traces))
                per_row[row] = chosen
                others += len(rest)
                split = chain_split(chosen, rest)
                if not split.whole:
                    split_sessions += 1
                    untrained += split.untrained_tokens
                    log.warning(
                        "%s: the main chain has %d segments; SkyRL trains on the first, "
                        "%d generated tokens of the others are left out",
                        chosen.session_id,
                        split.segments,
                        split.untrained_tokens,
                    )
        rows_out = [t for t in per_row if t is not None]
        logprobs = [t.logprobs for t in rows_out]
        return {
            "prompt_token_ids": [t.prompt_ids.tolist() for t in rows_out],
            "response_ids": [t.response_ids.tolist() for t in rows_out],
            "rewards": [float(t.reward or 0.0) for t in rows_out],
            "loss_masks": [t.loss_mask.tolist() for t in rows_out],
            "stop_reasons": [t.finish_reason or "stop" for t in rows_out],
            "rollout_metrics": {
                "polar/sessions": len(rows_out),
                "polar/other_traces": others,
                "polar/split_sessions": split_sessions,
                "polar/untrained_tokens": untrained,
                "polar/mean_reward": sum(float(t.reward or 0.0) for t in rows_out) / max(1, len(rows_out)),
            },
            "rollout_logprobs": None if any(lp is None for lp in logprobs) else [lp.tolist() for lp in logprobs if lp is not None],
            "trajectory_ids": ids,
            "is_last_step": None,
        }


def group_of(input_batch: GeneratorInput, instance_id: str) -> str:
    """The Polar group of a prompt: its ``instance_id`` (SkyRL's uid, the
    dataset row), made unique per step with the batch's phase and step."""
    meta = input_batch.get("batch_metadata")
    if meta is None:
        return instance_id
    return f"{meta.training_phase}-{meta.global_step}/{instance_id}"


def _of_session(task: Task, index: int, traces: list[Trace]) -> list[Trace]:
    """The traces of sample ``index`` of ``task``; raises when it ended
    without a trajectory."""
    sample = task.samples[index]
    if sample.result is None or sample.result.trajectory_uri is None:
        raise PolarError(f"{sample.session_id} ended {sample.state} without a trajectory: {sample.error}")
    return [t for t in traces if t.session_id == sample.session_id]
