"""slime: Polar as a rollout function (``--rollout-function-path
polar_client.bridges.slime.generate_rollout``).

slime's rollout manager loads the function by that path and calls it once
per rollout step, ``generate_rollout(args, rollout_id, data_source,
evaluation=False)``. It takes ``args.rollout_batch_size`` prompt groups
from the data source (each ``args.n_samples_per_prompt`` copies of a
``Sample``), submits one Polar task per group with one session per sample
(its instruction: the prompt, a string or the last user message; its
``group_id``: ``rollout-<rollout_id>/<group_index>``), waits for them, and
fills each ``Sample`` from its session's main trace: ``tokens`` (prompt +
response ids), ``response_length``, ``loss_mask``, ``rollout_log_probs``,
``reward``, ``status`` (``TRUNCATED`` when the trace's last call hit its
length limit, else ``COMPLETED``), ``weight_versions`` (the policy versions
its calls ran under), ``session_id`` and ``metadata["polar"]`` (trace id,
chain role, labels, the session's other traces). It returns slime's
``RolloutFnTrainOutput`` with the groups in order.

Configuration is by environment, since slime's ``args`` has no place for
it: ``POLAR_SERVER`` (the rollout server), ``POLAR_ROLLOUT_TOKEN``,
``POLAR_TASK_FILE`` (a JSON file of the task request's fields besides the
instruction and the sample count), ``POLAR_POLICY_VERSION`` (stamped on the
tasks as ``metadata.policy_version``, when set), ``POLAR_WAIT_SECS``.

Not tested in ``cargo xtask test``: slime is on no package registry this
machine reaches (docs/TRAINERS.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from slime.rollout.base_types import RolloutFnTrainOutput
from slime.utils.async_utils import run
from slime.utils.types import Sample

from ..aio import AsyncClient
from ..errors import PolarError
from ..trajectories import Trace, load_task
from ..types import Task
from .common import chain_split, instruction_of, pick


def _settings() -> tuple[str, dict[str, Any], float]:
    server = os.environ.get("POLAR_SERVER", "").strip()
    if not server:
        raise PolarError("the Polar rollout function needs POLAR_SERVER (the rollout server's URL)")
    template: dict[str, Any] = {}
    if path := os.environ.get("POLAR_TASK_FILE"):
        template = json.loads(Path(path).read_text())
        if not isinstance(template, dict):
            raise PolarError(f"POLAR_TASK_FILE {path}: not a JSON object")
    return server, template, float(os.environ.get("POLAR_WAIT_SECS", "3600"))


def _instruction(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else instruction_of(prompt)


def task_request(template: dict[str, Any], group: list[Any], rollout_id: int) -> dict[str, Any]:
    """The task of one prompt group."""
    first = group[0]
    body: dict[str, Any] = {
        "timeout_secs": 1800,
        "agent": {"harness": "shell"},
        **template,
        "task_id": f"slime-{uuid.uuid4().hex[:24]}",
        "instruction": _instruction(first.prompt),
        "num_samples": len(group),
    }
    metadata = dict(body.get("metadata") or {})
    metadata["group_id"] = f"rollout-{rollout_id}/{first.group_index}"
    if version := os.environ.get("POLAR_POLICY_VERSION"):
        metadata["policy_version"] = version
    body["metadata"] = metadata
    return body


def fill(sample: Any, trace: Trace, others: list[Trace]) -> None:
    """A slime ``Sample`` from a trace."""
    sample.tokens = trace.input_ids.tolist()
    sample.response_length = len(trace.response_ids)
    sample.loss_mask = trace.loss_mask.tolist()
    sample.rollout_log_probs = None if trace.logprobs is None else trace.logprobs.tolist()
    sample.reward = trace.reward
    sample.status = Sample.Status.TRUNCATED if trace.finish_reason == "length" else Sample.Status.COMPLETED
    sample.weight_versions = list(trace.policy_versions)
    sample.session_id = trace.session_id
    split = chain_split(trace, others)
    sample.metadata = {
        **(sample.metadata or {}),
        "polar": {
            "trace_id": trace.trace_id,
            "chain_role": trace.chain_role,
            "labels": list(trace.labels),
            "other_traces": [t.trace_id for t in others],
            "chain_segments": split.segments,
            "untrained_tokens": split.untrained_tokens,
        },
    }


async def _rollout(args: Any, rollout_id: int, data_source: Any) -> RolloutFnTrainOutput:
    server, template, wait_secs = _settings()
    groups = data_source.get_samples(args.rollout_batch_size)
    requests = [task_request(template, g, rollout_id) for g in groups]
    async with AsyncClient(server) as polar:
        for body in requests:
            await polar.submit(body)
        tasks: list[Task] = await asyncio.gather(*(polar.wait(b["task_id"], timeout=wait_secs) for b in requests))
    loop = asyncio.get_running_loop()
    others = 0
    for group, task in zip(groups, tasks):
        traces = await loop.run_in_executor(None, load_task, task)
        for sample, view in zip(group, task.samples):
            if view.result is None or view.result.trajectory_uri is None:
                raise PolarError(f"{view.session_id} ended {view.state} without a trajectory: {view.error}")
            chosen, rest = pick([t for t in traces if t.session_id == view.session_id])
            fill(sample, chosen, rest)
            others += len(rest)
    rewards = [float(s.reward or 0.0) for g in groups for s in g]
    metrics = {"polar/sessions": len(rewards), "polar/other_traces": others,
               "polar/mean_reward": sum(rewards) / max(1, len(rewards))}
    return RolloutFnTrainOutput(samples=groups, metrics=metrics)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> RolloutFnTrainOutput:
    """slime's rollout function (see the module's doc), run on slime's own
    background event loop. Evaluation rollouts are not served: slime's
    ``--eval-function-path`` defaults to ``--rollout-function-path``, so
    name another one (slime's ``slime.rollout.sglang_rollout.generate_rollout``)."""
    if evaluation:
        raise PolarError(
            "the Polar rollout function serves training rollouts only: set --eval-function-path to another"
        )
    result: RolloutFnTrainOutput = run(_rollout(args, rollout_id, data_source))
    return result
