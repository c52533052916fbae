"""The task's verifier in a child process under a hard timeout, so no verifier can kill or block its caller.

Used by the reward service (every group) and the learner's held-out evaluation (services/learner/evaluate.py).

A verifier is user code fed with a worker's output: on pathological input it can raise, recurse, eat
memory or never return (a huge number string, a regex blow-up, a loop in a custom task). A thread
cannot be stopped, so the verifier runs in one child process (spawned: it imports the task, never
torch), one request per group: the group's decoded texts and its reference go in, one reward per text
comes back (for an EnvironmentTask: each sample's actions go in, its replayed episode comes back). The child outlives the group and serves the next; the round trip costs 0.1-0.3 ms per
group on a busy 2-core machine (benchmarks/reward_verifier_overhead.py).

Policy for a group the verifier fails on (`VerifierFailedError`: the reward service dead-letters the
group with the reason, so the learner never trains on a made-up reward; the evaluation counts the prompt
as wrong):
- no answer within `timeout_s` (`[reward] verifier_timeout_s`): the child is killed and a fresh one
  started before the next group; reason `verifier timeout: ...`;
- the verifier raised: reason `verifier raised: <type>: <message>`; the child keeps serving;
- the child died (a crash, os._exit, the OOM killer): replaced; reason `verifier process died: ...`;
- a reward that is not a finite number in [0, 1]: reason `verifier returned ...`.
"""

from __future__ import annotations

import ctypes
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from shared.config import TaskConfig
from shared.tasks import TaskAdapter, build_task
from shared.tasks.environment import EnvironmentTask, Replay

log = logging.getLogger(__name__)

FailureKind = Literal["timeout", "raised", "died", "bad_reward"]
STARTUP_TIMEOUT_S = 60.0  # spawning imports the task's modules; a cold start on a loaded 2-core machine takes ~1 s
MAX_REASON_CHARS = 300


class VerifierFailedError(Exception):
    """The verifier gave no usable reward for a group; `kind` names the policy case (module docstring)."""

    def __init__(self, kind: FailureKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


class VerifierPool:
    """One verifier child, reused across groups and replaced when it hangs or dies. Not thread-safe:
    the service's loop is its only caller."""

    def __init__(self, task: TaskConfig, timeout_s: float) -> None:
        self.task = task  # the child builds the same adapter from it (shared.tasks.build_task)
        self.timeout_s = timeout_s
        self.num_replaced = 0  # children killed after a hang or found dead
        self._context = multiprocessing.get_context("spawn")
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def start(self) -> VerifierPool:
        """Spawn the child and wait until it has built the task (a task that fails to build raises here)."""
        parent_conn, child_conn = self._context.Pipe()
        process = self._context.Process(
            target=serve_verifier, args=(child_conn, self.task, os.getpid()), name="verifier", daemon=True
        )
        process.start()
        child_conn.close()
        self._process, self._conn = process, parent_conn
        if not parent_conn.poll(STARTUP_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the verifier process did not start within {STARTUP_TIMEOUT_S} s")
        status, detail = parent_conn.recv()
        if status != "ready":
            self.close()
            raise RuntimeError(f"the verifier process could not build task {self.task.name!r}: {detail}")
        log.info("verifier process %d serving %s", process.pid, self.task.name)
        return self

    def score(self, texts: list[str], reference: str) -> list[float]:
        """One reward per text, computed in the child within `timeout_s`; raises VerifierFailedError."""
        rewards = list(self._request(("score", texts, reference)))
        check_rewards(rewards, len(texts))
        return rewards

    def replay(self, state: str, actions: list[list[str]]) -> list[Replay]:
        """Each sample's episode replayed in a fresh environment of an EnvironmentTask (its actions: the
        decoded model turns), in the child within `timeout_s`; raises VerifierFailedError."""
        replays = list(self._request(("replay", state, actions)))
        check_rewards([replay.reward for replay in replays], len(actions))
        return replays

    def _request(self, request: tuple[str, Any, Any]) -> list[Any]:
        """Send one request to the child and wait for its answer under the timeout policy (module docstring)."""
        if self._process is None or not self._process.is_alive():
            self._replace("found dead between groups")
        assert self._conn is not None
        started_s = time.monotonic()
        try:
            self._conn.send(request)
        except OSError as exc:  # it died after the check above: the same case as dying mid-request
            self._replace(f"could not take a request ({exc})")
            raise VerifierFailedError("died", f"verifier process died ({exc})") from None
        if not self._conn.poll(self.timeout_s):
            self._replace(f"no answer within {self.timeout_s} s")
            raise VerifierFailedError("timeout", f"verifier timeout: no result within {self.timeout_s} s")
        try:
            status, payload = self._conn.recv()
        except EOFError:
            exit_code = None
            if self._process is not None:
                self._process.join(timeout=1.0)  # the pipe closes a moment before the process is reaped
                exit_code = self._process.exitcode
            self._replace(f"exited with {exit_code}")
            raise VerifierFailedError("died", f"verifier process died (exit code {exit_code})") from None
        if status == "raised":
            raise VerifierFailedError("raised", f"verifier raised: {payload}")
        log.debug("verifier answered %s in %.1f ms", request[0], 1e3 * (time.monotonic() - started_s))
        return list(payload)

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within a second."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            try:
                conn.send(None)
            except OSError:  # the child is gone already
                pass
            conn.close()
        if process is not None:
            process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join()

    def _replace(self, why: str) -> None:
        old_pid = self.pid
        if self._process is not None:
            self._process.kill()  # SIGKILL: a verifier stuck in C code (a regex) ignores anything milder
            self._process.join()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None
        self.num_replaced += 1
        log.warning("verifier process %s %s: replacing it", old_pid, why)
        self.start()


def check_rewards(rewards: list[float], num_texts: int) -> None:
    if len(rewards) != num_texts:
        raise VerifierFailedError("bad_reward", f"verifier returned {len(rewards)} rewards for {num_texts} texts")
    for reward in rewards:
        if not isinstance(reward, float) or not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
            raise VerifierFailedError("bad_reward", f"verifier returned {reward!r}, not a number in [0, 1]")


def serve_verifier(conn: Connection, task_config: TaskConfig, parent_pid: int) -> None:
    """The child's loop: build the task once, then (texts, reference) -> ("ok", rewards) or ("raised", why)
    until None or the parent's end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the terminal is the parent's to handle
    die_with_parent(parent_pid)
    try:
        task = build_task(task_config)
    except Exception as exc:  # boundary: reported to the parent, which refuses to start
        conn.send(("failed", f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]))
        return
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        try:
            result = answer(task, request)
        except Exception as exc:  # boundary: user code failed on this group only; the policy is the parent's
            conn.send(("raised", f"{type(exc).__name__}: {exc}"[:MAX_REASON_CHARS]))
            continue
        conn.send(("ok", result))


def answer(task: TaskAdapter, request: tuple[str, Any, Any]) -> list[float] | list[Replay]:
    """("score", texts, reference) -> one reward per text; ("replay", state, actions per sample) -> one
    Replay per sample (an EnvironmentTask's episodes, docs/environments.md)."""
    kind, first, second = request
    if kind == "score":
        return [float(task.score(text, second)) for text in first]
    if not isinstance(task, EnvironmentTask):
        raise TypeError(f"{type(task).__name__} is not an EnvironmentTask: it has no episodes to replay")
    replays = [task.replay(first, actions) for actions in second]
    return [Replay(float(replay.reward), list(replay.observations)) for replay in replays]


def die_with_parent(parent_pid: int) -> None:
    """A service killed with -9 while its verifier hangs must not leave the verifier spinning: on Linux
    the kernel sends this process SIGKILL when its parent dies (PR_SET_PDEATHSIG). Elsewhere an idle
    child still exits when the pipe closes; a hung one outlives its parent."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)
