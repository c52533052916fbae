"""`python -m services.coordinator`: serve the coordinator's REST API with uvicorn.

Heavy imports (fastapi, uvicorn, redis) happen after argument parsing, so `--help` answers at once.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shared.service_entry import parse_cli, start_service

if TYPE_CHECKING:
    from fastapi import FastAPI

    from services.coordinator.operators import OperatorCredentials
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
GIL_SWITCH_INTERVAL_S = 0.0005
GC_THRESHOLDS = (10_000, 20, 20)  # CPython's default is (700, 10, 10)


def main(argv: Sequence[str] | None = None) -> None:
    from services.coordinator.settings import CoordinatorSettings

    parse_cli("python -m services.coordinator", DESCRIPTION, argv, settings=CoordinatorSettings)

    # uvicorn handles SIGTERM / SIGINT itself (graceful shutdown), so no on_stop_signal here
    settings, run = start_service("coordinator", CoordinatorSettings)
    serve(build_app(settings, run), settings)


def build_app(settings: CoordinatorSettings, run: RunConfig) -> FastAPI:
    """The app over the run's Redis, once the credentials of RL_OPERATOR_TOKENS exist there."""
    from services.coordinator.app import create_app
    from services.coordinator.operators import OperatorCredentials
    from services.coordinator.redis_access import RedisAccess
    from shared.bus import connect
    from shared.keys import RunKeys

    redis_client = connect(settings.redis_url)
    try:
        provision_operator_tokens(
            settings.operator_token_values(), OperatorCredentials(redis_client, RunKeys(run.run_id))
        )
    except ValueError as exc:  # an id issued with another secret: say which, no traceback
        sys.exit(f"coordinator: {exc}")
    access = RedisAccess(redis_client, RunKeys(run.run_id))
    return create_app(
        run,
        redis_client,
        settings.admin_token.get_secret_value(),
        settings.join_token_value(),
        open_registration=settings.open_registration,
        access=access,
        bootstrap=cluster_bootstrap(settings, run),
    )


def tune_interpreter() -> None:
    """The GIL's switch interval and the garbage collector, set for a loop that answers thousands of requests/s."""
    import gc

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


def serve(app: FastAPI, settings: CoordinatorSettings) -> None:
    """Serve `app` with uvicorn until SIGTERM / SIGINT, within the connection limits, over TLS when configured;
    a stop answers the open long polls first (services/coordinator/uvicorn_server.py)."""
    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from services.coordinator.http_limits import uvicorn_limits
    from services.coordinator.uvicorn_server import CoordinatorServer

    tune_interpreter()  # after the heavy imports: the collector never walks what they made (frozen)
    limits = uvicorn_limits(
        max_connections=settings.max_connections,
        request_timeout_s=settings.request_timeout_s,
        keep_alive_s=settings.keep_alive_s,
    )
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        proxy_headers=False,
        # requests still open at a stop get 1 s; long polls (GET /v1/weights/latest) are answered at once
        timeout_graceful_shutdown=1,
        **limits,
        **tls_options(settings),
    )
    server = CoordinatorServer(config, app)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn raises the SIGINT it caught again once it has stopped
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)  # what uvicorn.run does: the port was taken, or the lifespan failed


def tls_options(settings: CoordinatorSettings) -> dict[str, Any]:
    """uvicorn's certificate and key when RL_TLS_CERT_FILE / RL_TLS_KEY_FILE are set (https only), else none
    (http); logs which, with the certificate's SHA-256 (what a worker may pin: RL_COORDINATOR_CERT_SHA256)."""
    from shared.tls import pem_certificate_sha256

    if settings.tls_cert_file is None or settings.tls_key_file is None:
        log.info("serving plain http on %s:%d (no RL_TLS_CERT_FILE)", settings.host, settings.port)
        return {}
    for name, path in (("RL_TLS_CERT_FILE", settings.tls_cert_file), ("RL_TLS_KEY_FILE", settings.tls_key_file)):
        if not path.is_file():
            sys.exit(f"coordinator: {name}={path} is not a file")
    try:
        sha256 = pem_certificate_sha256(settings.tls_cert_file)
    except ValueError as exc:  # an id issued with another secret: say which, no traceback
        sys.exit(f"coordinator: RL_TLS_CERT_FILE: {exc}")
    log.info(
        "serving https on %s:%d, certificate %s (sha256 %s)",
        settings.host,
        settings.port,
        settings.tls_cert_file,
        sha256,
    )
    return {"ssl_certfile": str(settings.tls_cert_file), "ssl_keyfile": str(settings.tls_key_file)}


def provision_operator_tokens(join_tokens: Sequence[str], credentials: OperatorCredentials) -> None:
    """Each token of RL_OPERATOR_TOKENS an issued credential, before anything is served (a Redis still starting
    is waited for: shared/retry.py). A token whose id exists with another secret stops the start (ValueError)."""
    import functools

    from shared.retry import call_with_retry

    for i, join_token in enumerate(join_tokens):
        name = f"RL_OPERATOR_TOKENS[{i}]"  # where it came from, in `relay-rl operators list`
        created = call_with_retry(functools.partial(credentials.provision, join_token, name), f"provision {name}")
        operator_id = join_token.partition(".")[0]
        log.info("join credential %s (%s): %s", operator_id, name, "provisioned" if created else "exists already")


def cluster_bootstrap(settings: CoordinatorSettings, run: RunConfig) -> ClusterBootstrap | None:
    """What GET /v1/cluster/bootstrap hands a joining worker: the run file as read at start (its `extends`
    resolved: one self-contained file), the run id, the public key; None (and a warning) without
    RL_WEIGHTS_PUBLIC_KEY."""
    from shared.api import ClusterBootstrap
    from shared.run_file import dump_run_file, read_run_file

    if settings.weights_public_key is None:
        log.warning("RL_WEIGHTS_PUBLIC_KEY is not set: GET /v1/cluster/bootstrap answers 404 (no `relay-rl worker`)")
        return None
    return ClusterBootstrap(
        run_id=run.run_id,
        run_config_toml=dump_run_file(read_run_file(settings.run_config)),
        weights_public_key=settings.weights_public_key,
        model=run.model,
    )


if __name__ == "__main__":
    main()
