"""Placement: which CPU cores the learner may use and which the rollout workers may use (docs/placement.md).

    python -m cluster.local --placement "learner=0 workers=1"            # one core each
    python -m cluster.local --placement "learner=0-3 workers=4-7 services=0"

Each process of a role runs under `taskset -c <its cores>` (it execs: the PID is still Python's), and its
thread counts match its share of them: OMP_NUM_THREADS and torch's intra-op threads (RL_TORCH_NUM_THREADS
for the learner and its evaluator, RL_WORKER_NUM_THREADS for a worker's torch engine), and vLLM-CPU's
thread binding (VLLM_CPU_OMP_THREADS_BIND). Workers share their cores: each of W workers on C cores gets
max(1, C // W) threads. `services` (Redis, the coordinator, the reward service) is optional: absent, they
float over every core the runner may use.

What it models: a learner and a fleet that do not compete for compute, so generation and training can
overlap as they would on separate machines. What it does not: separate memory bandwidth and caches (the
cores share them), a network between them (loopback; cluster/wan for that), or accelerators.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ROLES = ("learner", "workers", "services")


@dataclass(frozen=True)
class Placement:
    learner: tuple[int, ...]
    workers: tuple[int, ...]
    services: tuple[int, ...] = ()  # empty: unpinned
    num_workers: int = 1  # workers sharing `workers`: each gets its share of threads

    @classmethod
    def parse(cls, text: str, num_workers: int = 1) -> Placement:
        """ "learner=0 workers=1 [services=0-1]" (core lists as taskset takes them: 0,2,4-7); ValueError naming
        the problem: an unknown role, a missing one, a core this process may not use."""
        cores: dict[str, tuple[int, ...]] = {}
        for part in text.replace(";", " ").split():
            role, sep, value = part.partition("=")
            if not sep or role not in ROLES:
                raise ValueError(f"placement {text!r}: {part!r} is not one of {', '.join(r + '=CORES' for r in ROLES)}")
            cores[role] = parse_cores(value)
        missing = [role for role in ("learner", "workers") if role not in cores]
        if missing:
            raise ValueError(f"placement {text!r}: no cores for {' and '.join(missing)}")
        usable = os.sched_getaffinity(0)
        for role, listed in cores.items():
            if not set(listed) <= usable:
                raise ValueError(
                    f"placement {text!r}: {role} names cores {sorted(set(listed) - usable)} this machine does not "
                    f"let the runner use (usable: {sorted(usable)})"
                )
        return cls(cores["learner"], cores["workers"], cores.get("services", ()), max(1, num_workers))

    def cores_of(self, service: str) -> tuple[int, ...]:
        """The cores of a service by its runner name: learner, worker-<i>, else one of the services."""
        if service == "learner":
            return self.learner
        if service.startswith("worker"):
            return self.workers
        return self.services

    def threads_of(self, service: str) -> int:
        cores = self.cores_of(service)
        if service.startswith("worker"):
            return max(1, len(cores) // self.num_workers)
        return max(1, len(cores))

    def command_prefix(self, service: str) -> list[str]:
        cores = self.cores_of(service)
        return ["taskset", "-c", format_cores(cores)] if cores else []

    def env(self, service: str) -> dict[str, str]:
        """Thread counts matching the service's cores (nothing for an unpinned service)."""
        if not self.cores_of(service):
            return {}
        threads = str(self.threads_of(service))
        env = {"OMP_NUM_THREADS": threads}
        if service == "learner":
            env["RL_TORCH_NUM_THREADS"] = threads
        elif service.startswith("worker"):
            env["RL_WORKER_NUM_THREADS"] = threads
            env["VLLM_CPU_OMP_THREADS_BIND"] = format_cores(self.workers)
        return env

    def describe(self) -> str:
        services = format_cores(self.services) if self.services else "unpinned"
        return f"learner on cores {format_cores(self.learner)}, workers on {format_cores(self.workers)}, services {services}"


def parse_cores(text: str) -> tuple[int, ...]:
    """ "0,2,4-7" -> (0, 2, 4, 5, 6, 7); ValueError for anything else."""
    cores: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise ValueError(f"core list {text!r}: {part!r} is not a core or a range a-b") from None
        if first < 0 or last < first:
            raise ValueError(f"core list {text!r}: {part!r} is not a range of cores")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def format_cores(cores: tuple[int, ...]) -> str:
    return ",".join(str(core) for core in cores)
