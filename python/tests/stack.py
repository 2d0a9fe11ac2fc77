"""The real Polar stack on loopback for the client's tests, as `cargo xtask
demo` composes it: `polar mock-backend` (the mock inference server),
`polar rollout serve` and one gateway node (`polar agent`, root only), all
from the `polar` binary named by ``POLAR_BIN``; and moto, the S3-compatible
store the export tests use. Each process is stopped by its pid."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

import polar_client as pc

REPO = Path(__file__).resolve().parents[2]
MINI_AGENT = REPO / "examples" / "mini_agent.py"
TRAINER_TOKEN = "client-test-trainer-token"
NODE_TOKEN = "client-test-node-token"
GATEWAY_TOKEN = "client-test-gateway-token"
NODE_ID = "client-node"
S3_KEY = "testing"
S3_REGION = "us-east-1"
#: Where a stack started with moto exports its trajectories.
S3_BUCKET = "rollouts"
S3_EXPORT = f"s3://{S3_BUCKET}/gateway"
#: How long a daemon has to start listening.
START_WAIT = 60.0


def polar_bin() -> str:
    path = os.environ.get("POLAR_BIN", "")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError(
            f"POLAR_BIN={path!r}: these tests need the polar binary (cargo xtask test sets it to target/debug/polar)"
        )
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Daemon:
    """A process started with its log in a file, stopped by its pid."""

    def __init__(self, name: str, argv: list[str], log: Path, ready_url: str | None, port: int) -> None:
        self.name = name
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_WAIT
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}): {self.tail()}")
            try:
                if ready_url is None:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    return
                if httpx.get(ready_url, timeout=2).status_code < 500:
                    return
            except (OSError, httpx.HTTPError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not listen within {START_WAIT} s: {self.tail()}")
            time.sleep(0.1)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, grace: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


@dataclass
class Stack:
    dir: Path
    server: str
    gateway: str
    export: Path
    state: Path
    daemons: list[Daemon]

    def restart_rollout(self) -> None:
        """Stops the rollout server (SIGTERM) and starts it again on the
        same configuration and database."""
        old = next(d for d in self.daemons if d.name.startswith("rollout"))
        old.stop()
        argv = [str(a) for a in old.proc.args]  # type: ignore[union-attr]
        port = int(self.server.rsplit(":", 1)[1])
        new = Daemon(f"rollout (restart {len(self.daemons)})", argv, self.dir / f"rollout-{len(self.daemons)}.log",
                     f"{self.server}/health", port)
        self.daemons[self.daemons.index(old)] = new

    def logs(self) -> str:
        return "\n".join(f"--- {d.name} ---\n{d.tail()}" for d in self.daemons)

    def stop(self) -> None:
        """Stops every daemon and removes the directory (kept when
        ``POLAR_KEEP_TEST_DIR`` is set, for its logs)."""
        for d in reversed(self.daemons):
            d.stop()
        if not os.environ.get("POLAR_KEEP_TEST_DIR"):
            shutil.rmtree(self.dir, ignore_errors=True)


def config(dir: Path, mock: int, server: int, gateway: str, moto: Moto | None = None) -> str:
    """The stack's configuration; with ``moto``, the gateway exports to its
    bucket (`S3_EXPORT`) instead of a directory."""
    if moto is None:
        export = f'export = "{dir / "trajectories"}"'
        s3 = ""
    else:
        export = f'export = "{S3_EXPORT}"'
        s3 = f"""
[gateway.s3]
endpoint = "{moto.endpoint}"
region = "{S3_REGION}"
access_key_id = "{S3_KEY}"
secret_access_key = "{S3_KEY}"
"""
    return f"""[agent]
state_dir = "{dir / 'state'}"

[[backend]]
name = "local"
dialect = "vllm"
replicas = ["http://127.0.0.1:{mock}"]
served_model = "default"

[rollout]
listen = "127.0.0.1:{server}"
database = "{dir / 'rollout.sqlite'}"
tokens = ["{TRAINER_TOKEN}"]
gateway_token = "{GATEWAY_TOKEN}"
heartbeat_interval_ms = 500

[rollout.node_tokens]
{NODE_ID} = "{NODE_TOKEN}"

[gateway]
server = "http://127.0.0.1:{server}"
node_id = "{NODE_ID}"
listen = "{gateway}"
token = "{NODE_TOKEN}"
accept_tokens = ["{GATEWAY_TOKEN}"]
heartbeat_interval_ms = 500
running_workers = 2
ready_buffer = 2
{export}
formats = ["parquet", "jsonl"]
drain_timeout_secs = 20
{s3}
[gateway.policy]
upload_roots = ["{MINI_AGENT.parent}"]
"""


def start_stack(moto: Moto | None = None) -> Stack:
    """Starts the mock, the rollout server and a gateway; waits until the
    server lists the gateway. With ``moto``, the gateway exports to it."""
    polar = polar_bin()
    dir = Path(tempfile.mkdtemp(prefix="polar-client-test-"))
    # The sandboxes' user traverses it to the agent's trust bundle.
    dir.chmod(0o711)
    mock, server = free_port(), free_port()
    # A loopback address of this suite's own, so that it runs beside the
    # Rust end-to-end tests' gateways.
    gw_ip = "127.0.20.1"
    gw_port = free_port(gw_ip)
    cfg = dir / "polar.toml"
    cfg.write_text(config(dir, mock, server, f"{gw_ip}:{gw_port}", moto))
    daemons: list[Daemon] = []
    try:
        daemons.append(
            Daemon(
                "mock-backend",
                [polar, "mock-backend", "--listen", f"127.0.0.1:{mock}", "--served-model", "default"],
                dir / "mock.log",
                None,
                mock,
            )
        )
        url = f"http://127.0.0.1:{server}"
        daemons.append(
            Daemon("rollout", [polar, "rollout", "serve", "--config", str(cfg)], dir / "rollout.log", f"{url}/health", server)
        )
        daemons.append(
            Daemon(
                "gateway",
                [polar, "agent", "--config", str(cfg)],
                dir / "gateway.log",
                f"http://{gw_ip}:{gw_port}/healthz",
                gw_port,
            )
        )
        stack = Stack(dir, url, f"http://{gw_ip}:{gw_port}", dir / "trajectories", dir / "state", daemons)
        deadline = time.monotonic() + START_WAIT
        headers = {"authorization": f"Bearer {TRAINER_TOKEN}"}
        while True:
            nodes = httpx.get(f"{url}/v1/nodes", headers=headers, timeout=5).json()["nodes"]
            if any(n["node_id"] == NODE_ID and n["health"] == "healthy" for n in nodes):
                return stack
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not register: {stack.logs()}")
            time.sleep(0.2)
    except BaseException:
        for d in reversed(daemons):
            d.stop()
        raise


class Moto:
    """moto's S3 server on a free loopback port."""

    def __init__(self, dir: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.daemon = Daemon(
            "moto",
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            dir / "moto.log",
            self.endpoint + "/",
            self.port,
        )

    def create_bucket(self, bucket: str) -> None:
        r = httpx.put(f"{self.endpoint}/{bucket}", timeout=10)
        r.raise_for_status()

    def s3(self) -> pc.S3:
        """The client's options for this store."""
        return pc.S3(endpoint=self.endpoint, region=S3_REGION, access_key=S3_KEY, secret_key=S3_KEY)


def task(task_id: str, n: int, *, policy_version: str = "w-1", group_id: str | None = None, sleep: int = 0) -> dict[str, object]:
    """A task of ``n`` samples of the mini agent, rewarded when it made its file."""
    command = "python3 /workspace/mini_agent.py"
    if sleep:
        command = f"sleep {sleep}; {command}"
    return {
        "task_id": task_id,
        "instruction": "Create the file polar-demo.txt.",
        "num_samples": n,
        "timeout_secs": 120,
        "agent": {"harness": "shell", "options": {"command": command}},
        "runtime": {"prepare": [{"upload": {"from": str(MINI_AGENT), "to": "mini_agent.py"}}]},
        "evaluator": {"kind": "command", "options": {"command": "test -s polar-demo.txt"}},
        "builder": {"kind": "prefix_merging"},
        "metadata": {"group_id": group_id or f"group-{task_id}", "policy_version": policy_version},
    }


def task_template() -> dict[str, object]:
    """The fields of [`task`] a bridge's config gives (all but the id, the
    instruction, the sample count and the metadata, which it fills)."""
    return {k: v for k, v in task("x", 1).items() if k not in ("task_id", "instruction", "num_samples", "metadata")}
