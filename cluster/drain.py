"""python -m cluster.drain NAME_OR_ID: drain a worker of a running cluster with the admin token.

The worker finishes the batch in hand (published and acked), deregisters and exits; its tasks are
never lost. Settings come from <run dir>/cluster.env (default runs/latest). The same over plain HTTP:

    curl -X POST -H "Authorization: Bearer $RL_ADMIN_TOKEN" $RL_COORDINATOR_URL/v1/workers/<worker id>/drain
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx
from pydantic import TypeAdapter

from cluster.join import DEFAULT_RUN_DIR, cluster_trust, read_cluster_env
from shared.api import WorkerInfo, WorkerState

WORKER_LIST = TypeAdapter(list[WorkerInfo])


def resolve_worker_ids(client: httpx.Client, name_or_id: str) -> list[str]:
    """The live workers called `name_or_id` (a name may be shared), or that id."""
    workers = WORKER_LIST.validate_json(client.get("/v1/workers").raise_for_status().content)
    return [w.worker_id for w in workers if name_or_id in (w.worker_id, w.name) and w.state != WorkerState.DEAD]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.drain", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("worker", help="worker name (as shown on the dashboard) or id")
    parser.add_argument(
        "--run-dir", type=Path, default=DEFAULT_RUN_DIR, help="the cluster's run folder (default runs/latest)"
    )
    args = parser.parse_args(argv)
    try:
        cluster = read_cluster_env(args.run_dir)
        url = cluster["RL_COORDINATOR_URL"]
        verify = cluster_trust(cluster).verify_for(url)  # the admin token crosses only TLS off loopback
    except ValueError as exc:
        sys.exit(str(exc))
    headers = {"Authorization": f"Bearer {cluster['RL_ADMIN_TOKEN']}"}
    with httpx.Client(base_url=url, headers=headers, timeout=10.0, verify=verify) as client:
        worker_ids = resolve_worker_ids(client, args.worker)
        if not worker_ids:
            sys.exit(f"no live worker named or with id {args.worker!r}")
        for worker_id in worker_ids:
            response = client.post(f"/v1/workers/{worker_id}/drain")
            if response.status_code != 200:
                sys.exit(f"drain {worker_id}: HTTP {response.status_code}: {response.text}")
            drained = WorkerInfo.model_validate_json(response.content)
            print(f"{worker_id} ({drained.name}) is {drained.state.value}: it finishes its batch and leaves")


if __name__ == "__main__":
    main()
