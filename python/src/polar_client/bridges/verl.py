"""verl: Polar as an agent loop (``@register("polar")``).

verl's rollout worker (``AgentLoopWorker``) instantiates the loop named by
each sample's ``agent_name`` and awaits its ``run``, which here submits the
sample to a Polar rollout server as a task of one session (its instruction:
the last user message of ``raw_prompt``; its GRPO group: verl's ``uid``),
waits for it, reads the session's exported trajectory and returns its
tokens as an ``AgentLoopOutput``: ``prompt_ids``, ``response_ids``,
``response_mask`` (Polar's ``loss_mask``), ``response_logprobs``,
``reward_score`` (the evaluator's reward). Tested against verl 0.9.1.

Configuration, in the file ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
names (every key but ``name`` and ``_target_`` is optional; tokens come from
the environment when not given)::

    - name: polar
      _target_: polar_client.bridges.verl.PolarAgentLoop
      server: http://rollout:7070
      task:                      # the task request's fields besides the instruction
        timeout_secs: 1800
        agent: {harness: claude_code}
        evaluator: {kind: command, options: {command: "pytest -q"}}

A session can yield several traces (sub-agents, side calls, segments after
a compaction); verl 0.9.1 takes one output per sample, so the loop returns
the main chain's first segment (with token-faithful serving, the whole main
chain) and names the others in ``extra_fields["polar_other_traces"]`` (the
offline loader ``polar_client.load_task`` returns them all). When the main
chain has several segments the sample says so:
``extra_fields["polar_chain_segments"]`` (1: the whole chain) and
``["polar_untrained_tokens"]`` (generated tokens of the other segments). Generation is paused around a
weight update with [`weight_update`], which resumes naming the new policy
version; every trace says which version its tokens came from
(``extra_fields["polar_policy_version"]``, per span in Polar's export).
"""

from __future__ import annotations

import asyncio
import uuid
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from ..aio import AsyncClient
from ..client import Client
from ..errors import PolarError
from ..trajectories import Trace, load_task
from .common import chain_split, instruction_of, pick

#: How long one sample may take by default (the task's own budget counts too).
DEFAULT_WAIT = 3600.0


def output_of(trace: Trace, others: list[Trace], prompt_length: int, response_length: int) -> AgentLoopOutput:
    """The ``AgentLoopOutput`` of a trace, capped as verl's own loops cap
    (prompt from the left, response from the right)."""
    prompt = trace.prompt_ids.tolist()
    response = trace.response_ids.tolist()
    mask = trace.loss_mask.tolist()
    logprobs = None if trace.logprobs is None else trace.logprobs.tolist()
    truncated = len(prompt) > prompt_length or len(response) > response_length
    prompt = prompt[-prompt_length:]
    response, mask = response[:response_length], mask[:response_length]
    if logprobs is not None:
        logprobs = logprobs[:response_length]
    spans = trace.trace_metadata.get("spans") or ()
    split = chain_split(trace, others)
    return AgentLoopOutput(
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        response_logprobs=logprobs,
        reward_score=trace.reward,
        # Each merged call is an assistant turn after its prompt's turn.
        num_turns=2 * max(1, len(spans)),
        metrics=AgentLoopMetrics(),
        extra_fields={
            "polar_trace_id": trace.trace_id,
            "polar_session_id": trace.session_id,
            "polar_group_id": trace.group_id,
            "polar_chain_role": trace.chain_role,
            "polar_policy_version": trace.policy_version,
            "polar_truncated": truncated,
            "polar_other_traces": [t.trace_id for t in others],
            "polar_chain_segments": split.segments,
            "polar_untrained_tokens": split.untrained_tokens,
        },
    )


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str | None], AsyncClient]] = (
    weakref.WeakKeyDictionary()
)


def _client(server: str, token: str | None) -> AsyncClient:
    """One client per server and event loop for the worker's life: verl
    makes an agent loop per sample, all on the worker's loop."""
    per_loop = _clients.setdefault(asyncio.get_running_loop(), {})
    key = (server, token)
    if key not in per_loop:
        per_loop[key] = AsyncClient(server, token)
    return per_loop[key]


def _plain(value: Any) -> dict[str, Any]:
    """A mapping from verl's config (an OmegaConf node) as plain JSON data."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(value, DictConfig):
        plain = OmegaConf.to_container(value, resolve=True)
        assert isinstance(plain, dict)
        return {str(k): v for k, v in plain.items()}
    return dict(value)


@register("polar")
class PolarAgentLoop(AgentLoopBase):  # type: ignore[misc]
    """Runs each sample as a Polar session (see the module's doc)."""

    def __init__(
        self,
        *args: Any,
        server: str | None = None,
        token: str | None = None,
        task: Mapping[str, Any] | None = None,
        task_prefix: str = "verl",
        wait_secs: float = DEFAULT_WAIT,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if server is None:
            raise PolarError("the polar agent loop needs `server` (the rollout server's URL) in its config")
        self.server, self.token = server, token
        self.task_template = _plain(task or {})
        self.task_prefix = task_prefix
        self.wait_secs = wait_secs

    def task_request(self, instruction: str, uid: Any, extra_info: Any) -> dict[str, Any]:
        """The task of one sample: the template, the instruction, one
        session, the group (verl's ``uid``)."""
        body: dict[str, Any] = {
            "timeout_secs": 1800,
            "agent": {"harness": "shell"},
            **self.task_template,
            "task_id": f"{self.task_prefix}-{uuid.uuid4().hex[:24]}",
            "instruction": instruction,
            "num_samples": 1,
        }
        metadata = dict(body.get("metadata") or {})
        if uid is not None:
            metadata["group_id"] = str(uid)
        if isinstance(extra_info, Mapping):
            metadata.setdefault("extra", {}).update({"verl_extra_info": dict(extra_info)})
        body["metadata"] = metadata
        return body

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        request = self.task_request(instruction_of(kwargs["raw_prompt"]), kwargs.get("uid"), kwargs.get("extra_info"))
        polar = _client(self.server, self.token)
        await polar.submit(request)
        task = await polar.wait(request["task_id"], timeout=self.wait_secs)
        sample = task.samples[0]
        if sample.result is None or sample.result.trajectory_uri is None:
            raise PolarError(f"{sample.session_id} ended {sample.state} without a trajectory: {sample.error}")
        # Reading Parquet blocks: off the event loop.
        traces = await asyncio.get_running_loop().run_in_executor(None, load_task, task)
        chosen, others = pick(traces)
        return output_of(chosen, others, self.rollout_config.prompt_length, self.rollout_config.response_length)


@contextmanager
def weight_update(client: Client, policy_version: str) -> Iterator[None]:
    """Around verl's weight sync (``checkpoint_manager.update_weights`` or
    the rollout's ``wake_up``): pauses generation on every Polar gateway,
    then resumes naming ``policy_version``."""
    with client.paused(policy_version):
        yield
