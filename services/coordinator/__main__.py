"""`python -m services.coordinator`: serve the coordinator's REST API with uvicorn.

Heavy imports (fastapi, uvicorn, redis) happen after argument parsing, so `--help` answers at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shared.service_entry import parse_cli, start_service

if TYPE_CHECKING:
    from services.coordinator.settings import CoordinatorSettings
    from shared.api import ClusterBootstrap
    from shared.config import RunConfig

log = logging.getLogger("services.coordinator")

DESCRIPTION = (
    "The control plane: worker registration, leases and drains, the staleness gate, run status, "
    "the capacity model (/v1/capacity), cost-aware activation and the cost ledger (/v1/activation, /v1/cost), "
    "Prometheus metrics (/metrics) and a live dashboard (/dashboard). "
    "Stateless: everything lives in Redis, so it can be restarted at any time. API docs at /docs."
)
ENVIRONMENT_HELP = """\
environment:
  RL_ADMIN_TOKEN        required secret: bearer token of admin calls (at least 16 characters)
  RL_JOIN_TOKEN         required secret: workers send it to register (header X-RL-Join-Token; >= 16 chars)
  RL_OPEN_REGISTRATION  true: no join token, anyone may register (dev only; default false)
  RL_COORDINATOR_HOST   interface to bind (default 127.0.0.1)
  RL_COORDINATOR_PORT   TCP port (default 8000)
  RL_REDIS_URL          Redis holding the run's streams and state (default redis://127.0.0.1:6379/0)
  RL_REDIS_ACL          true: a Redis ACL user per worker, created at registration (needs +acl, +client|kill)
  RL_WORKER_REDIS_URL   the Redis URL handed to workers, without credentials (default: their own;
                        at /v1/cluster/bootstrap: RL_REDIS_URL without its credentials)
  RL_WEIGHTS_PUBLIC_KEY the learner's public key: set, GET /v1/cluster/bootstrap hands workers it, the run
                        file and the Redis URL (`relay-rl worker --coordinator URL --token JOIN_TOKEN`)
  RL_ROLLOUT_KEY_RETENTION_S  how long a departed worker's rollout-signing key is kept (default 86400)
  RL_DRAIN_GRACE_S      with RL_REDIS_ACL: a worker draining this long loses its Redis user (default 300)
  RL_RUN_CONFIG         the run TOML file (default configs/demo.toml): lease_s, staleness bound, ...
  RL_RUN_ID             overrides run_id of the run file
  RL_LOG_LEVEL          logging level (default INFO)
"""
GIL_SWITCH_INTERVAL_S = 0.0005
GC_THRESHOLDS = (10_000, 20, 20)  # CPython's default is (700, 10, 10)


def main(argv: Sequence[str] | None = None) -> None:
    parse_cli("python -m services.coordinator", DESCRIPTION, argv, epilog=ENVIRONMENT_HELP)

    import gc
    import sys

    import uvicorn

    from services.coordinator.app import create_app
    from services.coordinator.settings import CoordinatorSettings
    from shared.bus import connect

    # uvicorn handles SIGTERM / SIGINT itself (graceful shutdown), so no on_stop_signal here
    settings, run = start_service("coordinator", CoordinatorSettings)
    from services.coordinator.redis_access import AclSetupError, RedisAccess, check_acl_setup
    from shared.keys import RunKeys

    redis_client = connect(settings.redis_url)
    access = RedisAccess(
        redis_client,
        RunKeys(run.run_id),
        acl=settings.redis_acl,
        worker_redis_url=settings.worker_redis_url,
        rollout_key_retention_s=settings.rollout_key_retention_s,
        drain_grace_s=settings.drain_grace_s,
    )
    if settings.redis_acl:
        try:
            check_acl_setup(redis_client, settings.redis_url)
        except AclSetupError as exc:
            sys.exit(f"coordinator: {exc}")
    else:
        log.warning("RL_REDIS_ACL is false: workers get no Redis user of their own and use their RL_REDIS_URL")
    app = create_app(
        run,
        redis_client,
        settings.admin_token.get_secret_value(),
        settings.join_token_value(),
        access=access,
        bootstrap=cluster_bootstrap(settings, run),
    )
    # The control pass runs in a thread next to the event loop. With the default 5 ms switch interval,
    # every time the loop waits on a socket the pass keeps the GIL for up to 5 ms before the loop gets it
    # back: at 1000 heartbeats/s that alone queued heartbeats for hundreds of ms (benchmarks/load_heartbeat.py).
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    # A full collection walked the ~90k objects of the imported libraries and stopped the loop for
    # 65-120 ms, every ~10 s under load. Frozen, they are never walked again; a larger first generation
    # lets most per-request garbage die by reference count before any collection runs.
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(), proxy_headers=False)


def cluster_bootstrap(settings: CoordinatorSettings, run: RunConfig) -> ClusterBootstrap | None:
    """What GET /v1/cluster/bootstrap hands a joining worker: the run file as read at start, the run id,
    the public key and the workers' Redis URL; None (and a warning) without RL_WEIGHTS_PUBLIC_KEY."""
    from shared.api import ClusterBootstrap
    from shared.redis_urls import without_credentials

    if settings.weights_public_key is None:
        log.warning("RL_WEIGHTS_PUBLIC_KEY is not set: GET /v1/cluster/bootstrap answers 404 (no `relay-rl worker`)")
        return None
    return ClusterBootstrap(
        run_id=run.run_id,
        run_config_toml=settings.run_config.read_text(),
        weights_public_key=settings.weights_public_key,
        redis_url=settings.worker_redis_url or without_credentials(settings.redis_url),
        model=run.model,
    )


if __name__ == "__main__":
    main()
