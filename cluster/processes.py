"""Child processes of the local cluster: started with their own log file, stopped by PID.

Children run in their own session so a terminal's Ctrl-C reaches only the runner, which then stops
them in order (workers first, learner last) with SIGTERM, and SIGKILL after a grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.signing import SIGNING_KEY_ENV


@dataclass(frozen=True)
class EntryPoint:
    """What a child runs: `python -m <module>`, with `env` added to the environment the runner gives it. A test or
    a benchmark may give a worker another entry point than services.rollout (its lying workers, through
    ClusterOptions.worker_entry_points), so the runner itself names no benchmark module."""

    module: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class ServiceProcess:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def exit_code(self) -> int | None:
        """None while it runs; else its exit code (negative: the signal that killed it)."""
        return self.popen.poll()

    def stop(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within `grace_s`. Returns the exit code."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        return self.popen.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.alive():
            self.popen.kill()
            self.popen.wait(timeout=10)

    def log_tail(self, num_lines: int = 20) -> str:
        return tail_of(self.log_path, num_lines)


def tail_of(path: Path, num_lines: int) -> str:
    """The last `num_lines` lines of a log file; "" before it exists."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])
    except FileNotFoundError:
        return ""


def start_service(
    name: str,
    module: str,
    env: dict[str, str],
    log_dir: Path,
    cwd: Path,
    launcher: Sequence[str] = (),
    command_prefix: Sequence[str] = (),
) -> ServiceProcess:
    """`python [launcher...] -m <module>` with `env` added to this process's environment, output to
    <log_dir>/<name>.log. `launcher`: e.g. torchrun's `-m torch.distributed.run --standalone --nproc-per-node=2`
    (the process is then torchrun: it passes SIGTERM to its ranks, and they exit when it is killed).
    `command_prefix`: what runs it, e.g. `ip netns exec rlw-w0` (it execs: the PID is still Python's).
    A weight-signing key in this process's environment is not passed on: a child gets one only in `env`
    (the learner), so a worker never inherits one from the shell that started the cluster."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    inherited = {key: value for key, value in os.environ.items() if key != SIGNING_KEY_ENV}
    child_env = {**inherited, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **env}
    with open(log_path, "ab") as log_file:
        popen = subprocess.Popen(
            [*command_prefix, sys.executable, *launcher, "-m", module],
            env=child_env,
            cwd=cwd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return ServiceProcess(name, popen, log_path)
