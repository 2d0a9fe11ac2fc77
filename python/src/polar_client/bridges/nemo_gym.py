"""NeMo Gym: Polar as an agent server, the server NeMo Gym's rollout
collection (and NeMo RL through it) posts each row to (``POST /run``).

The agent is a ``SimpleResponsesAPIAgent`` (NeMo Gym's base class for
agent servers). Its ``run`` takes a ``BaseRunRequest``: the row's
``responses_create_params`` (whose ``input``'s last user message is the
task's instruction) and its other fields (``group_id``, when the row has
one, names the Polar group); it submits the row to a Polar rollout server
as a task of one session, waits for it, reads the session's exported
trajectory and answers a ``BaseVerifyResponse``: the ``reward`` (Polar's
evaluator's) and a ``response`` whose output holds one assistant message
per model call of the trace, each with the training fields NeMo Gym's
model servers give (``prompt_token_ids``: every token before the call's
generation, ``generation_token_ids``, ``generation_log_probs``), so the
calls chain token for token into the trace's ``prompt_ids +
response_ids`` and the generated tokens are exactly its ``loss_mask``'s.
Tested against nemo-gym 0.4.0 (Python 3.12).

Configuration (a NeMo Gym server config, like its other agents)::

    polar_agent:
      responses_api_agents:
        polar:
          entrypoint: ...             # a module calling PolarAgent.run_webserver()
          polar_server: http://rollout:7070
          task: {timeout_secs: 1800, agent: {harness: claude_code},
                 evaluator: {kind: command, options: {command: "pytest -q"}}}

The messages' text is not repeated per call (``content`` is an empty
``output_text``); the trace's identity is in the response's ``metadata``
(``polar_trace_id``, ``polar_session_id``, ``polar_policy_version``).
A session's other traces (sub-agents, side calls) are named in
``metadata["polar_other_traces"]``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, Optional

from fastapi import Body, HTTPException
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import (
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseOutputMessageForTraining,
)
from pydantic import ConfigDict

from ..aio import AsyncClient
from ..errors import PolarError
from ..trajectories import Trace, load_task
from .common import chain_split, instruction_of, pick


class PolarAgentConfig(BaseResponsesAPIAgentConfig):  # type: ignore[misc]
    """The agent server's config: NeMo Gym's keys and Polar's."""

    polar_server: str
    polar_token: Optional[str] = None
    task: dict[str, Any] = {}
    task_prefix: str = "gym"
    wait_secs: float = 3600.0


class PolarRunRequest(BaseRunRequest):  # type: ignore[misc]
    """A rollout row: ``responses_create_params`` and its other fields."""

    model_config = ConfigDict(extra="allow")


class PolarVerifyResponse(BaseVerifyResponse):  # type: ignore[misc]
    model_config = ConfigDict(extra="allow")


def output_items(trace: Trace) -> list[NeMoGymResponseOutputMessageForTraining]:
    """One assistant message per model call (``trace_metadata.spans``),
    with the tokens before its generation, its generation and logprobs."""
    prompt = trace.prompt_ids.tolist()
    response = trace.response_ids.tolist()
    logprobs = trace.logprobs.tolist() if trace.logprobs is not None else None
    items = []
    for i, span in enumerate(trace.trace_metadata.get("spans") or ()):
        start, end = int(span["response_start"]), int(span["response_start"]) + int(span["response_len"])
        items.append(
            NeMoGymResponseOutputMessageForTraining(
                id=f"msg_{trace.session_id}_{trace.trace_index}_{i}",
                content=[{"type": "output_text", "text": "", "annotations": []}],
                role="assistant",
                status="completed",
                type="message",
                prompt_token_ids=prompt + response[:start],
                generation_token_ids=response[start:end],
                generation_log_probs=logprobs[start:end] if logprobs is not None else [0.0] * (end - start),
            )
        )
    return items


class PolarAgent(SimpleResponsesAPIAgent):  # type: ignore[misc]
    """Runs each rollout row as a Polar session (see the module's doc)."""

    config: PolarAgentConfig

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        # Polar's harnesses call the model themselves: there is no single
        # response to give for a request.
        raise HTTPException(status_code=501, detail="the Polar agent serves /run only")

    async def run(self, body: PolarRunRequest = Body()) -> PolarVerifyResponse:
        params = body.responses_create_params
        raw = params.input
        messages = [{"role": "user", "content": raw}] if isinstance(raw, str) else [_plain(m) for m in raw]
        extra = body.model_extra or {}
        task_id = f"{self.config.task_prefix}-{uuid.uuid4().hex[:24]}"
        request: dict[str, Any] = {
            "timeout_secs": 1800,
            "agent": {"harness": "shell"},
            **self.config.task,
            "task_id": task_id,
            "instruction": instruction_of(messages),
            "num_samples": 1,
        }
        metadata = dict(request.get("metadata") or {})
        if extra.get("group_id") is not None:
            metadata["group_id"] = str(extra["group_id"])
        request["metadata"] = metadata
        async with AsyncClient(self.config.polar_server, self.config.polar_token) as polar:
            await polar.submit(request)
            task = await polar.wait(task_id, timeout=self.config.wait_secs)
        sample = task.samples[0]
        if sample.result is None or sample.result.trajectory_uri is None:
            raise PolarError(f"{sample.session_id} ended {sample.state} without a trajectory: {sample.error}")
        traces = await asyncio.get_running_loop().run_in_executor(None, load_task, task)
        chosen, others = pick(traces)
        split = chain_split(chosen, others)
        response = NeMoGymResponse(
            id=f"resp_{chosen.session_id}",
            created_at=float(int(time.time())),
            model=params.model or "polar",
            object="response",
            output=output_items(chosen),
            parallel_tool_calls=False,
            tool_choice="auto",
            tools=[],
            metadata={
                "polar_trace_id": chosen.trace_id,
                "polar_session_id": chosen.session_id,
                "polar_policy_version": chosen.policy_version or "",
                "polar_other_traces": ",".join(t.trace_id for t in others),
                "polar_chain_segments": str(split.segments),
                "polar_untrained_tokens": str(split.untrained_tokens),
            },
        )
        return PolarVerifyResponse(
            responses_create_params=params,
            response=response,
            reward=float(chosen.reward or 0.0),
            **extra,
        )


def _plain(item: Any) -> dict[str, Any]:
    dumped = item.model_dump() if hasattr(item, "model_dump") else dict(item)
    assert isinstance(dumped, dict)
    return dumped
