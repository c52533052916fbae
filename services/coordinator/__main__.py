"""`python -m services.coordinator`: serve the coordinator's REST API with uvicorn.

Heavy imports (fastapi, uvicorn, redis) happen after argument parsing, so `--help` answers at once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from shared.service_entry import parse_cli, start_service

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
    app = create_app(
        run, connect(settings.redis_url), settings.admin_token.get_secret_value(), settings.join_token_value()
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


if __name__ == "__main__":
    main()
