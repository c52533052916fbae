"""`relay-rl operators issue NAME | list | revoke ID`: join credentials for the run, with the admin token.

A credential is an identity a quarantine sticks to (services/coordinator/operators.py): give one to each
operator (or each worker) instead of the cluster's shared RL_JOIN_TOKEN, and a worker quarantined under it
cannot register again under a new id until an admin releases it (POST /v1/workers/<id>/release).

    relay-rl operators issue alice      prints the credential's id and its join token (shown once): the
                                        operator starts workers with `relay-rl worker --token=<join token>`
    relay-rl operators list             every credential: state (active, quarantined, revoked), its workers
    relay-rl operators revoke op-...    refuses it from now on; its active and standby workers are drained

The coordinator is --coordinator, else $RL_COORDINATOR_URL, else the one in <run dir>/cluster.env; the admin
token is $RL_ADMIN_TOKEN, else the one in <run dir>/cluster.env. The same over plain HTTP:

    curl -X POST -H "Authorization: Bearer $RL_ADMIN_TOKEN" -H 'Content-Type: application/json' \\
         -d '{"name": "alice"}' $RL_COORDINATOR_URL/v1/operators

Only the standard library is imported at module level: `relay-rl operators --help` builds its parser here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx

    from shared.api import OperatorInfo

ADMIN_TOKEN_ENV = "RL_ADMIN_TOKEN"
COORDINATOR_ENV = "RL_COORDINATOR_URL"
REQUEST_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser, default_run_dir: Path) -> None:
    common = argparse.ArgumentParser(add_help=False)  # each action takes them, after its own arguments too
    common.add_argument(
        "--coordinator",
        default=os.environ.get(COORDINATOR_ENV),
        help=f"the coordinator's base URL (default ${COORDINATOR_ENV}, else the one in <run dir>/cluster.env)",
    )
    common.add_argument(
        "--run-dir", type=Path, default=default_run_dir, help="a local cluster's run folder (default runs/latest)"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = actions.add_parser(
        "issue", parents=[common], help="a new join credential; prints its id and join token (shown once)"
    )
    issue.add_argument("name", help="whom it is for (a label)")
    actions.add_parser("list", parents=[common], help="every credential: its state and workers")
    revoke = actions.add_parser(
        "revoke", parents=[common], help="refuse a credential from now on; its live workers are drained"
    )
    revoke.add_argument("operator_id", help="the credential's id (op-...)")


def main(args: argparse.Namespace) -> None:
    import httpx

    url, admin_token = coordinator_and_admin_token(args.coordinator, args.run_dir)
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S) as client:
            print(run_action(client, args))
    except httpx.HTTPError as exc:
        sys.exit(f"relay-rl operators: cannot reach the coordinator at {url}: {exc}")


def run_action(client: httpx.Client, args: argparse.Namespace) -> str:
    """One action against the coordinator; returns what to print (exits with the coordinator's reason on an error)."""
    from shared.api import OPERATORS_PATH, IssuedOperator, OperatorInfo, RevokedOperator

    if args.action == "issue":
        issued = IssuedOperator.model_validate_json(expect(client.post(OPERATORS_PATH, json={"name": args.name}), 201))
        return (
            f"issued {issued.operator.operator_id} for {issued.operator.name}; its join token (shown once):\n"
            f"{issued.join_token}\n"
            f"its workers: relay-rl worker --coordinator {client.base_url} --token={issued.join_token}"
        )
    if args.action == "list":
        raw = expect(client.get(OPERATORS_PATH), 200)
        from pydantic import TypeAdapter

        return render_operators(TypeAdapter(list[OperatorInfo]).validate_json(raw))
    revoked = RevokedOperator.model_validate_json(expect(client.delete(f"{OPERATORS_PATH}/{args.operator_id}"), 200))
    drained = ", ".join(revoked.drained_worker_ids) or "none"
    return f"revoked {revoked.operator.operator_id} ({revoked.operator.name}); workers drained: {drained}"


def render_operators(operators: list[OperatorInfo]) -> str:
    if not operators:
        return "no join credentials issued (workers use the cluster's shared join token)"
    lines = [f"{'id':<16} {'name':<20} {'state':<12} workers"]
    for operator in operators:
        workers = ", ".join(operator.worker_ids) or "-"
        held = (
            f" (held by quarantined {', '.join(operator.quarantined_worker_ids)})"
            if operator.quarantined_worker_ids
            else ""
        )
        lines.append(f"{operator.operator_id:<16} {operator.name:<20} {operator.state.value:<12} {workers}{held}")
    return "\n".join(lines)


def expect(response: httpx.Response, status_code: int) -> bytes:
    if response.status_code != status_code:
        sys.exit(f"relay-rl operators: HTTP {response.status_code}: {response.text[:300]}")
    return response.content


def coordinator_and_admin_token(explicit_url: str | None, run_dir: Path) -> tuple[str, str]:
    """--coordinator / $RL_COORDINATOR_URL and $RL_ADMIN_TOKEN, each else from <run dir>/cluster.env."""
    url, admin_token = explicit_url, os.environ.get(ADMIN_TOKEN_ENV)
    if not url or not admin_token:
        from cluster.join import read_cluster_env

        try:
            cluster = read_cluster_env(run_dir)
        except ValueError as exc:
            sys.exit(f"relay-rl operators: no --coordinator/${ADMIN_TOKEN_ENV} and {exc}")
        url, admin_token = url or cluster[COORDINATOR_ENV], admin_token or cluster[ADMIN_TOKEN_ENV]
    return url.rstrip("/"), admin_token
