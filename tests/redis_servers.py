"""Real Redis for tests: a standalone redis-server and a 3-master Redis Cluster, on loopback.

Each server runs on free ports in its own temporary directory, which is removed when it
stops. Without the binaries the tests that need them are skipped, unless CI is set (then they
fail: CI must not pass by skipping the Redis backend). Import the fixtures into a conftest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.children import tied
from tests.ports import free_port
from tests.waiting import until_sync

START_TIMEOUT = 15.0
"""Seconds a server (or the cluster) gets to answer; a slow CI box, not a hang, fits in it."""


def require(*binaries: str) -> None:
    """Skip the test without `binaries`; fail it instead when the CI variable is set."""
    missing = [b for b in binaries if shutil.which(b) is None]
    if missing:
        reason = f"needs {', '.join(missing)} on PATH"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (required because CI is set)")
        pytest.skip(reason)


class _ExitedError(RuntimeError):
    """The server process ended while starting (most often: its port was taken)."""


def _wait(check: Callable[[], bool], what: str) -> None:
    until_sync(
        check, START_TIMEOUT, f"{what} ready", tolerate=(redis.ConnectionError, redis.ResponseError)
    )


class RedisServer:
    """One redis-server on 127.0.0.1, no persistence; `args` are extra config options."""

    def __init__(self, *args: str, cluster: bool = False) -> None:
        self.args = args
        self.port = 0
        self.dir = Path(tempfile.mkdtemp(prefix="kvsi-redis-"))
        self._proc: subprocess.Popen[bytes] | None = None
        self._cluster = cluster
        self._bus_port = 0
        """With `cluster`: the cluster bus port, picked with the first port and kept after a
        start that worked (the other nodes know the node by it)."""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self, port: int | None = None) -> None:
        """Start on `port`, or on a free one (again on another if it was taken meanwhile)."""
        for attempt in range(3):
            if self._cluster and (port is None or not self._bus_port):
                self._bus_port = free_port()  # taken meanwhile too, the node would not start
            try:
                self._start(port or free_port())
                return
            except _ExitedError:
                if port is not None or attempt == 2:
                    raise

    def _start(self, port: int) -> None:
        self.port = port
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115  (the process owns it)
        self._proc = subprocess.Popen(
            tied([
                "redis-server",
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", str(self.dir),
                "--save", "",
                "--appendonly", "no",
                *(["--cluster-enabled", "yes", "--cluster-port", str(self._bus_port)]
                  if self._cluster else []),
                *self.args,
            ]),
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()

        def up() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                self._proc = None
                raise _ExitedError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            with self.client() as c:
                return bool(c.ping())

        _wait(up, f"redis-server on port {self.port}")

    def stop(self) -> None:
        """Stop the process (ours: we hold its Popen); without persistence, its data goes."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
            self._proc = None

    def remove(self) -> None:
        """Stop it and delete its directory."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisClusterServers:
    """Three cluster-enabled masters, joined by `redis-cli --cluster create`, no replicas;
    `args` are extra config options of every node."""

    def __init__(self, *args: str) -> None:
        self.nodes = [
            RedisServer(
                "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "5000",
                *args,
                cluster=True,
            )
            for _ in range(3)
        ]  # fmt: skip

    @property
    def url(self) -> str:
        """A startup node: the client discovers the others."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                "redis-cli", "--cluster", "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas", "0", "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT,
        )  # fmt: skip

        def ok() -> bool:
            for node in self.nodes:
                with node.client() as c:
                    info = c.cluster("INFO")  # parsed by redis-py into a dict of strings
                    if info["cluster_state"] != "ok" or info["cluster_known_nodes"] != "3":
                        return False
            return True

        _wait(ok, "redis cluster")

    def remove(self) -> None:
        for node in self.nodes:
            node.remove()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A standalone redis-server for the whole session (tests isolate by key prefix)."""
    require("redis-server")
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    """A 3-master Redis Cluster for the whole session (tests isolate by key prefix)."""
    require("redis-server", "redis-cli")
    cluster = RedisClusterServers()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()
