"""Supervision of the local cluster's children: a crashed service is started again, with backoff.

The policy is compose's `restart:` (docker-compose.yml carries the same one):
- `unless-stopped` (Redis, coordinator, reward service): any exit, whatever its code, is a crash;
  the service is started again.
- `on-failure` (the learner, rollout workers): a non-zero exit (or a kill) is a crash; exit 0 means
  it stopped on purpose: a worker that was drained stays out, and for the learner the runner asks
  whether the run is complete (cluster/local.py).

Backoff: the n-th consecutive crash waits min(max_delay_s, base_delay_s * 2**(n-1)) before the
restart; a run that lasted `reset_after_s` resets n (as compose does after 10 s up). More than
`max_restarts` restarts within `window_s` and the supervisor gives up on that service (it stays
down, the runner says so and goes on: a dead worker never ends a run).

The supervisor never sleeps: the runner calls `poll()` from its progress loop; a restart that is
due is made there. Every crash and restart is logged with the exit code and counted in a
`SupervisionRecord`, written to <run_dir>/supervision.json for the run report.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("cluster.supervisor")

START_FAILED_EXIT_CODE = 255  # recorded as the crash's exit code when starting the service raised


class Child(Protocol):
    """A started process the supervisor watches (cluster.processes.ServiceProcess, RedisServer)."""

    @property
    def pid(self) -> int: ...

    def exit_code(self) -> int | None:
        """None while it runs; else its exit code (negative: killed by that signal)."""
        ...

    def stop(self) -> int | None: ...

    def log_tail(self, num_lines: int = 20) -> str:
        """The end of its log ("" while it has none)."""
        ...


def last_words(child: Child, num_lines: int = 3) -> str:
    """The end of a crashed child's log, for the crash's warning: the cause of a crash shows where the
    supervisor's log is all there is (CI)."""
    tail = child.log_tail(num_lines).strip()
    return f"; its log ends:\n{tail}" if tail else ""


class RestartMode(StrEnum):
    UNLESS_STOPPED = "unless-stopped"
    ON_FAILURE = "on-failure"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how fast a crashed service is started again (module docstring)."""

    mode: RestartMode = RestartMode.UNLESS_STOPPED
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    max_restarts: int = 5  # within window_s; one more crash and the supervisor gives up
    window_s: float = 300.0
    reset_after_s: float = 10.0  # a run this long resets the backoff to base_delay_s

    def __post_init__(self) -> None:
        if not 0 < self.base_delay_s <= self.max_delay_s:
            raise ValueError(f"need 0 < base_delay_s <= max_delay_s, got {self.base_delay_s}, {self.max_delay_s}")
        if self.max_restarts < 0 or self.window_s <= 0:
            raise ValueError(f"need max_restarts >= 0 and window_s > 0, got {self.max_restarts}, {self.window_s}")

    def delay_s(self, num_consecutive_crashes: int) -> float:
        """Backoff before the restart after the n-th consecutive crash (n >= 1)."""
        return min(self.max_delay_s, self.base_delay_s * 2 ** max(0, num_consecutive_crashes - 1))


class ServiceState(StrEnum):
    RUNNING = "running"
    BACKING_OFF = "backing_off"  # crashed; restarts when its delay is over
    EXITED = "exited"  # exited 0 under on-failure: not restarted
    GAVE_UP = "gave_up"  # crashed more than max_restarts times within window_s
    STOPPED = "stopped"  # stopped by the supervisor (end of run)


class ServiceRestarts(BaseModel):
    """One service's crashes and restarts: what the run report shows of its ServiceRecord (`restarts`)."""

    model_config = ConfigDict(extra="forbid")

    num_restarts: int = Field(0, ge=0, description="times started again after a crash")
    crash_exit_codes: list[int] = Field(default_factory=list, description="exit code of each crash (-9: SIGKILL)")
    gave_up: bool = Field(False, description="more than max_restarts crashes within window_s: left down")


class ServiceRecord(ServiceRestarts):
    """One service's supervision history."""

    restart_policy: RestartMode
    state: ServiceState

    def restarts(self) -> ServiceRestarts:
        return ServiceRestarts(
            num_restarts=self.num_restarts, crash_exit_codes=self.crash_exit_codes, gave_up=self.gave_up
        )


class SupervisionRecord(BaseModel):
    """<run_dir>/supervision.json: written by the runner (cluster/local.py), read by cluster/report.py."""

    model_config = ConfigDict(extra="forbid")

    services: dict[str, ServiceRecord] = Field(default_factory=dict)

    @property
    def num_restarts(self) -> int:
        return sum(service.num_restarts for service in self.services.values())


@dataclass
class Supervised:
    name: str
    start: Callable[[], Child]  # starts it again with the same command, env and ports
    policy: RestartPolicy
    child: Child
    state: ServiceState = ServiceState.RUNNING
    started_at_s: float = field(default_factory=time.monotonic)
    restart_at_s: float = 0.0
    num_consecutive_crashes: int = 0
    restart_times_s: deque[float] = field(default_factory=deque)
    record: ServiceRecord | None = None


class Supervisor:
    """Watches started children; `poll()` restarts the crashed ones once their backoff is over."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.services: dict[str, Supervised] = {}

    def add(self, name: str, start: Callable[[], Child], policy: RestartPolicy) -> Child:
        """Start `name` now and supervise it from here on."""
        child = start()
        self.services[name] = Supervised(
            name,
            start,
            policy,
            child,
            started_at_s=self.clock(),
            record=ServiceRecord(restart_policy=policy.mode, state=ServiceState.RUNNING),
        )
        return child

    def child(self, name: str) -> Child:
        return self.services[name].child

    def state(self, name: str) -> ServiceState:
        return self.services[name].state

    def poll(self) -> None:
        """Notice crashes (schedule their restart, or give up) and make the restarts that are due."""
        now_s = self.clock()
        for service in self.services.values():
            if service.state == ServiceState.RUNNING:
                code = service.child.exit_code()
                if code is not None:
                    self._exited(service, code, now_s)
            if service.state == ServiceState.BACKING_OFF and now_s >= service.restart_at_s:
                self._restart(service, now_s)

    def restart_now(self, name: str) -> None:
        """Start an exited service again at once (the learner stopped by someone else's SIGTERM)."""
        service = self.services[name]
        if service.state in (ServiceState.EXITED, ServiceState.BACKING_OFF):
            self._restart(service, self.clock())

    def stop(self, order: list[str]) -> None:
        """Stop the named services by PID in this order (SIGTERM, then SIGKILL after a grace period)."""
        for name in order:
            service = self.services.get(name)
            if service is None:
                continue
            code = service.child.stop()
            service.state = ServiceState.STOPPED
            log.info("stopped %s (pid %d, exit %s)", name, service.child.pid, code)

    def summary(self) -> SupervisionRecord:
        records = {}
        for name, service in self.services.items():
            assert service.record is not None
            records[name] = service.record.model_copy(update={"state": service.state})
        return SupervisionRecord(services=records)

    def write_summary(self, path: Path) -> None:
        tmp_path = path.with_suffix(".json.tmp")
        tmp_path.write_text(self.summary().model_dump_json(indent=2) + "\n")
        os.replace(tmp_path, path)

    # helpers
    def _exited(self, service: Supervised, code: int, now_s: float) -> None:
        assert service.record is not None
        if code == 0 and service.policy.mode == RestartMode.ON_FAILURE:
            service.state = ServiceState.EXITED
            log.info("%s (pid %d) exited with 0", service.name, service.child.pid)
            return
        service.record.crash_exit_codes.append(code)
        if now_s - service.started_at_s >= service.policy.reset_after_s:
            service.num_consecutive_crashes = 0
        service.num_consecutive_crashes += 1
        window_start_s = now_s - service.policy.window_s
        while service.restart_times_s and service.restart_times_s[0] < window_start_s:
            service.restart_times_s.popleft()
        if len(service.restart_times_s) >= service.policy.max_restarts:
            service.state = ServiceState.GAVE_UP
            service.record.gave_up = True
            log.error(
                "%s (pid %d) crashed with exit code %d; %d restarts within %.0fs already: giving up on it%s",
                service.name,
                service.child.pid,
                code,
                len(service.restart_times_s),
                service.policy.window_s,
                last_words(service.child),
            )
            return
        delay_s = service.policy.delay_s(service.num_consecutive_crashes)
        service.state = ServiceState.BACKING_OFF
        service.restart_at_s = now_s + delay_s
        log.warning(
            "%s (pid %d) crashed with exit code %d; restarting in %.1fs%s",
            service.name,
            service.child.pid,
            code,
            delay_s,
            last_words(service.child),
        )

    def _restart(self, service: Supervised, now_s: float) -> None:
        assert service.record is not None
        service.restart_times_s.append(now_s)
        service.record.num_restarts += 1
        try:
            service.child = service.start()
        # policy: a start that fails (Redis not coming up, no such binary) is one more crash: backed
        # off and retried within the restart budget, then given up on, never the end of the runner
        except (OSError, RuntimeError) as exc:
            log.error("starting %s again failed: %s", service.name, exc)
            service.started_at_s = now_s
            self._exited(service, START_FAILED_EXIT_CODE, now_s)
            return
        service.state = ServiceState.RUNNING
        service.started_at_s = self.clock()
        log.warning(
            "restarted %s (pid %d): restart %d, %d within the last %.0fs",
            service.name,
            service.child.pid,
            service.record.num_restarts,
            len(service.restart_times_s),
            service.policy.window_s,
        )
