"""Fixtures: one real stack (stack.py) per test session; moto, and a
second stack whose gateway exports to it, for the tests that ask for them."""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from stack import GATEWAY_TOKEN, S3_BUCKET, TRAINER_TOKEN, Moto, Stack, start_stack

_ids = itertools.count()


def _started(moto: Moto | None = None) -> Iterator[Stack]:
    if os.geteuid() != 0:
        raise RuntimeError("the gateway (polar agent) needs root: run these tests as root")
    s = start_stack(moto)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    yield from _started()


@pytest.fixture(scope="session")
def moto() -> Iterator[Moto]:
    dir = Path(tempfile.mkdtemp(prefix="polar-client-moto-"))
    m = Moto(dir)
    try:
        m.create_bucket(S3_BUCKET)
        yield m
    finally:
        m.daemon.stop(5)
        shutil.rmtree(dir, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_stack(moto: Moto) -> Iterator[Stack]:
    """A stack whose gateway exports to moto (``stack.S3_EXPORT``)."""
    yield from _started(moto)


@pytest.fixture
def task_id(request: pytest.FixtureRequest) -> str:
    """A task id unique in the session, named after the test."""
    name = request.node.name.replace("test_", "").replace("_", "-")[:36].strip("-")
    return f"{name}-{next(_ids)}"


__all__ = ["GATEWAY_TOKEN", "TRAINER_TOKEN"]
