#!/usr/bin/env python3
"""A GRPO-style training loop's rollout side, against a running Polar stack
(`cargo xtask demo --serve` starts one and prints this command with its
addresses and tokens).

Each step submits one task per prompt with `--group-size` samples (one GRPO
group), waits for the results, loads the exported trajectories as token
arrays, keeps the main chain's traces generated under the current policy
version, computes group-relative advantages from the rewards, and prints
what a trainer would consume. Samples that are not usable (the
infrastructure or the evaluator ended them: no reward) are listed with
their reasons and left out; a group without any usable sample is skipped
with a message. Between steps it pauses generation on the
gateways, "updates the weights" (this example has no model: a real trainer
runs its optimizer here) and resumes naming the new policy version.

The mock inference server's policy always solves the demo task, so every
sample would earn the same reward and every advantage would be 0; the
evaluator here therefore scores a solved sample with a random number in
[0, 1) written to its reward file: a stand-in reward that makes the
arithmetic visible. Use your own evaluator (docs/ROLLOUT-API.md) for real
rewards.

Needs polar-client in a virtual environment (Debian's Python is externally
managed): `python3 -m venv .venv && .venv/bin/pip install ./python`, then
run this with `.venv/bin/python`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import time
from pathlib import Path

import polar_client as pc

MINI_AGENT = Path(__file__).resolve().parent / "mini_agent.py"
REWARD = (
    "test -s polar-demo.txt && "
    "python3 -c 'import random; print(round(random.random(), 3))' > \"$POLAR_REWARD_FILE\""
)


def task(task_id: str, group: str, n: int, version: str, reward: str) -> dict[str, object]:
    return {
        "task_id": task_id,
        "instruction": "Create the file polar-demo.txt.",
        "num_samples": n,
        "timeout_secs": 120,
        "agent": {"harness": "shell", "options": {"command": "python3 /workspace/mini_agent.py"}},
        "runtime": {"prepare": [{"upload": {"from": str(MINI_AGENT), "to": "mini_agent.py"}}]},
        "evaluator": {"kind": "command", "options": {"command": reward, "reward": "file"}},
        "metadata": {"group_id": group, "policy_version": version},
    }


async def step(
    client: pc.AsyncClient, run: str, index: int, prompts: int, n: int, version: str, reward: str
) -> list[pc.Trace]:
    ids = [f"{run}-{index}-p{p}" for p in range(prompts)]
    for p, task_id in enumerate(ids):
        await client.submit(task(task_id, f"{run}/step-{index}/prompt-{p}", n, version, reward))
    # A sample the infrastructure or the evaluator ended has no reward: it
    # is shown here and left out, never trained on as a reward of 0.
    views = await asyncio.gather(*(client.wait(i, timeout=600, failures="ignore") for i in ids))
    loop = asyncio.get_running_loop()
    kept: list[pc.Trace] = []
    for v in views:
        if v.failures:
            print(f"{v.task_id}: {v.usable} of {v.requested} samples usable ({v.status})")
            for g in v.failures:
                print(f"  {g}")
        traces = await loop.run_in_executor(None, functools.partial(pc.load_task, v, failures="ignore"))
        # Main-chain traces, not ended by a fault, generated under this version.
        chosen = pc.select(traces, roles=["main"], policy_versions=[version])
        if not chosen:
            print(f"skipping group {v.group_id}: no usable sample to train on")
            continue
        kept.extend(chosen)
    return kept


def show(index: int, version: str, traces: list[pc.Trace]) -> None:
    print(f"\nstep {index} (policy {version}): {len(traces)} traces in {len({t.group_id for t in traces})} groups")
    if not traces:
        print("trainer batch: empty (every group was skipped); no update this step")
        return
    adv = pc.advantages(traces)
    print(f"{'trace':<34} {'group':<34} {'reward':>6} {'adv':>7} {'prompt':>6} {'resp':>5} {'train':>5}")
    for t, a in zip(traces, adv):
        reward = "-" if t.reward is None else f"{t.reward:.3f}"
        print(
            f"{t.trace_id:<34} {t.group_id or '':<34} {reward:>6} {a:>7.3f} "
            f"{len(t.prompt_ids):>6} {len(t.response_ids):>5} {int(t.loss_mask.sum()):>5}"
        )
    # What the trainer consumes: per trace, input = prompt + response, the
    # loss on the masked response positions, weighted by the advantage,
    # with the sampling logprobs for the importance ratio.
    tokens = sum(int(t.loss_mask.sum()) for t in traces)
    print(f"trainer batch: {len(traces)} sequences, {tokens} trained tokens, mean |adv| {abs(adv).mean():.3f}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="the rollout server's URL")
    ap.add_argument("--token", help="a trainer token (default: POLAR_ROLLOUT_TOKEN)")
    ap.add_argument("--gateway-token", help="the gateways' token, to pause them (default: POLAR_GATEWAY_TOKEN)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=2, help="groups per step")
    ap.add_argument("--group-size", type=int, default=4, help="samples per group")
    ap.add_argument(
        "--reward-command",
        default=REWARD,
        help="the evaluator's command, run in the sample's workspace; it writes the reward to $POLAR_REWARD_FILE",
    )
    args = ap.parse_args()
    run = f"grpo-{int(time.time())}"
    async with pc.AsyncClient(args.server, args.token, gateway_token=args.gateway_token) as client:
        for index in range(args.steps):
            version = f"w-{index}"
            traces = await step(client, run, index, args.prompts, args.group_size, version, args.reward_command)
            show(index, version, traces)
            if index + 1 < args.steps:
                async with client.paused(f"w-{index + 1}"):
                    print(f"\n(generation paused: the trainer updates the weights to w-{index + 1})")


if __name__ == "__main__":
    asyncio.run(main())
