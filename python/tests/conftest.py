"""Fixtures: one real stack (stack.py) per test session, one moto."""

from __future__ import annotations

import itertools
import os
from typing import Iterator

import pytest

from stack import GATEWAY_TOKEN, TRAINER_TOKEN, Moto, Stack, start_stack

_ids = itertools.count()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    if os.geteuid() != 0:
        raise RuntimeError("the gateway (polar agent) needs root: run these tests as root")
    s = start_stack()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def moto(stack: Stack) -> Iterator[Moto]:
    m = Moto(stack.dir)
    try:
        yield m
    finally:
        m.daemon.stop(5)


@pytest.fixture
def task_id(request: pytest.FixtureRequest) -> str:
    """A task id unique in the session, named after the test."""
    name = request.node.name.replace("test_", "").replace("_", "-")[:36].strip("-")
    return f"{name}-{next(_ids)}"


__all__ = ["GATEWAY_TOKEN", "TRAINER_TOKEN"]
