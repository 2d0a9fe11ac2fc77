"""examples/grpo_loop.py against the real stack (the demo's composition)."""

from __future__ import annotations

import subprocess
import sys

from stack import GATEWAY_TOKEN, REPO, TRAINER_TOKEN, Stack


def test_grpo_loop_example(stack: Stack) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "examples/grpo_loop.py"), "--server", stack.server, "--token", TRAINER_TOKEN,
         "--gateway-token", GATEWAY_TOKEN, "--steps", "2", "--prompts", "2", "--group-size", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "step 0 (policy w-0): 4 traces in 2 groups" in text, text
    assert "step 1 (policy w-1): 4 traces in 2 groups" in text, text
    assert "generation paused" in text
    rows = [line.split() for line in text.splitlines() if line.startswith("grpo-")]
    assert len(rows) == 8
    # Within a group of two, the advantages are opposite (or both 0 on a tie).
    by_group: dict[str, list[float]] = {}
    for r in rows:
        by_group.setdefault(r[1], []).append(float(r[3]))
    assert len(by_group) == 4
    for adv in by_group.values():
        assert len(adv) == 2 and abs(adv[0] + adv[1]) < 1e-3


def test_grpo_loop_example_shows_failed_samples_and_skips_empty_groups(stack: Stack) -> None:
    # An evaluator that never writes its reward file: no sample is usable.
    out = subprocess.run(
        [sys.executable, str(REPO / "examples/grpo_loop.py"), "--server", stack.server, "--token", TRAINER_TOKEN,
         "--gateway-token", GATEWAY_TOKEN, "--steps", "1", "--prompts", "1", "--group-size", "2",
         "--reward-command", "true"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert ": 0 of 2 samples usable (failed)" in text, text
    assert "2 samples error: evaluation failed: reward file .polar/reward: not found" in text, text
    assert "skipping group grpo-" in text and ": no usable sample to train on" in text, text
    assert "trainer batch: empty (every group was skipped); no update this step" in text, text
    assert "nan" not in text and "Warning" not in out.stderr, out.stderr
