"""The client over HTTPS: a rollout server serving a certificate of a
cluster CA that `polar rollout ca` made, verified against ``ca_file`` or the
``POLAR_ROLLOUT_CA_FILE`` environment variable (what `polar slurm run`
gives a job's command), and refused without it."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

import polar_client as pc
from stack import Daemon, TRAINER_TOKEN, free_port, polar_bin


@pytest.fixture(scope="module")
def https_server() -> Iterator[tuple[str, Path]]:
    polar = polar_bin()
    dir = Path(tempfile.mkdtemp(prefix="polar-client-tls-"))
    ca = dir / "ca"
    subprocess.run([polar, "rollout", "ca", "init", "--dir", str(ca)], check=True, capture_output=True)
    subprocess.run(
        [polar, "rollout", "ca", "issue", "--dir", str(ca), "--name", "rollout", "--ip", "127.0.0.1"],
        check=True,
        capture_output=True,
    )
    port = free_port()
    cfg = dir / "rollout.toml"
    cfg.write_text(
        f"""[rollout]
listen = "127.0.0.1:{port}"
database = "{dir / 'rollout.sqlite'}"
tokens = ["{TRAINER_TOKEN}"]
gateway_token = "client-tls-gateway-token"
node_tokens = {{ n1 = "client-tls-node-token" }}

[rollout.tls]
cert_file = "{ca / 'rollout.crt'}"
key_file = "{ca / 'rollout.key'}"
"""
    )
    daemon = Daemon("rollout (https)", [polar, "rollout", "serve", "--config", str(cfg)], dir / "rollout.log", None, port)
    try:
        yield f"https://127.0.0.1:{port}", ca / "ca.crt"
    finally:
        daemon.stop()
        shutil.rmtree(dir, ignore_errors=True)


def test_the_client_verifies_the_server_against_the_cluster_ca(https_server: tuple[str, Path]) -> None:
    url, ca = https_server
    with pc.Client(url, TRAINER_TOKEN, ca_file=ca) as client:
        assert client.nodes() == []


def test_the_ca_comes_from_the_environment(https_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, ca = https_server
    monkeypatch.setenv("POLAR_ROLLOUT_CA_FILE", str(ca))
    with pc.Client(url, TRAINER_TOKEN) as client:
        assert client.nodes() == []


@pytest.mark.asyncio
async def test_the_async_client_verifies_it_too(https_server: tuple[str, Path]) -> None:
    url, ca = https_server
    async with pc.AsyncClient(url, TRAINER_TOKEN, ca_file=ca) as client:
        assert await client.nodes() == []


def test_without_the_ca_the_server_is_refused(https_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = https_server
    monkeypatch.delenv("POLAR_ROLLOUT_CA_FILE", raising=False)
    with pc.Client(url, TRAINER_TOKEN) as client, pytest.raises(pc.ServerUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        client.nodes()


def test_a_missing_ca_file_is_an_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLAR_ROLLOUT_CA_FILE", "/nonexistent/ca.crt")
    with pytest.raises(pc.PolarError, match="POLAR_ROLLOUT_CA_FILE.*/nonexistent/ca.crt"):
        pc.Client("https://127.0.0.1:1", TRAINER_TOKEN)
