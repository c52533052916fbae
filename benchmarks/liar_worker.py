"""A lying rollout worker, FOR TESTS AND MEASUREMENT ONLY (docs/trust.md): the rollout worker of
`python -m services.rollout`, same settings, with its engine or chunk store wrapped by a liar of
benchmarks/liars.py.

    RL_FAULT_INJECT=<kind> [RL_FAULT_STALE_AFTER_VERSION=2] <the worker's RL_* settings> python -m benchmarks.liar_worker

Kinds: garbage_logprobs, stale_weights, swapped_text (the engine lies), corrupt_chunks, forged_manifest (its
chunk server lies). The fault suite (`make test-faults`) and `make bench-trust` start it through the local
runner: `ClusterOptions(worker_entry_points=liar_entry_points({"worker-3": "stale_weights"}))`. The runner
(cluster/) names no benchmark, and `python -m services.rollout` cannot lie.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from benchmarks.liars import DEFAULT_STALE_AFTER_VERSION, SERVING_FAULTS, FaultKind, LyingEngine, TamperingStore
from cluster.processes import EntryPoint
from shared.service_entry import parse_cli

if TYPE_CHECKING:
    from engines.interface import InferenceEngine
    from services.rollout.settings import RolloutSettings
    from shared.config import RunConfig
    from shared.weight_channel import ChunkStore

MODULE = "benchmarks.liar_worker"  # this entry point, as the runner starts it (python -m)
log = logging.getLogger(MODULE)

KIND_ENV = "RL_FAULT_INJECT"
STALE_AFTER_ENV = "RL_FAULT_STALE_AFTER_VERSION"


def liar_entry_points(liars: Mapping[str, str]) -> dict[str, EntryPoint]:
    """ClusterOptions.worker_entry_points for `liars` (worker service name -> fault kind): each of those workers
    runs this module with its lie in RL_FAULT_INJECT. ValueError for an unknown kind, before anything starts."""
    return {name: EntryPoint(MODULE, {KIND_ENV: FaultKind(kind).value}) for name, kind in liars.items()}


def lie_from_environment(environ: Mapping[str, str] = os.environ) -> tuple[FaultKind, int]:
    """(kind, stale_after_version) from RL_FAULT_INJECT and RL_FAULT_STALE_AFTER_VERSION; ValueError for a
    missing or unknown kind."""
    name = environ.get(KIND_ENV, "")
    try:
        kind = FaultKind(name)
    except ValueError:
        raise ValueError(f"{KIND_ENV}={name!r}: expected one of {[k.value for k in FaultKind]}") from None
    return kind, int(environ.get(STALE_AFTER_ENV, DEFAULT_STALE_AFTER_VERSION))


def lying_parts(
    kind: FaultKind, stale_after_version: int, run: RunConfig, settings: RolloutSettings, engine: InferenceEngine
) -> tuple[InferenceEngine, ChunkStore | None]:
    """The honest worker's engine and store with the lie of `kind` wrapped around one of them."""
    log.warning("FAULT INJECTION ON (%s): this worker lies on purpose (tests and measurement only)", kind.value)
    if kind in SERVING_FAULTS:
        store = TamperingStore(kind, run.broadcast.keep_versions, settings.public_key(), engine.weights_dir)
        return engine, store
    return LyingEngine(engine, kind, stale_after_version=stale_after_version), None


def main(argv: Sequence[str] | None = None) -> int:
    from services.rollout.__main__ import serve
    from services.rollout.settings import RolloutSettings

    parse_cli(f"python -m {MODULE}", __doc__, argv, settings=RolloutSettings)
    kind, stale_after_version = lie_from_environment()  # a wrong kind fails before anything starts
    return serve(partial(lying_parts, kind, stale_after_version))


if __name__ == "__main__":
    sys.exit(main())
