"""`relay-rl operators issue NAME | list | budget ID | release ID | revoke ID`: join credentials for the run,
with the admin token.

A credential is an identity a quarantine and a budget stick to (services/coordinator/operators.py,
credential_budget.py): give one to each operator instead of the cluster's shared RL_JOIN_TOKEN. It holds at
most its budget (live workers, leases, registrations a minute: the run file's [credentials] unless set here),
its workers earn their leases together, and when one of them is quarantined (or the credential's record is)
it registers nobody and its live workers stop, until an admin releases it.

    relay-rl operators issue alice [--max-workers N] [--max-leases N] [--registrations-per-min R]
                                        prints the credential's id and its join token (shown once): the
                                        operator starts workers with `relay-rl worker --token=<join token>`
    relay-rl operators list             every credential: state, budget, live workers, record
    relay-rl operators budget op-... --max-workers 64    raises (or lowers) a credential's budget
    relay-rl operators release op-...   lets a quarantined credential back in, with its quarantined workers
    relay-rl operators revoke op-...    refuses it from now on; its active and standby workers are drained

The coordinator is --coordinator, else $RL_COORDINATOR_URL, else the one in <run dir>/cluster.env; the admin
token is $RL_ADMIN_TOKEN, else the one in <run dir>/cluster.env. An https coordinator is verified with
$RL_COORDINATOR_CA_FILE or $RL_COORDINATOR_CERT_SHA256 (else cluster.env's, else the system's CAs); plain http
to a host that is not loopback is refused unless RL_INSECURE_HTTP=1 (the admin token would cross in clear
text). The same with curl:

    curl --cacert "$RL_COORDINATOR_CA_FILE" -X POST -H "Authorization: Bearer $RL_ADMIN_TOKEN" \\
         -H 'Content-Type: application/json' -d '{"name": "alice"}' $RL_COORDINATOR_URL/v1/operators

Only the standard library is imported at module level: `relay-rl operators --help` builds its parser here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.tool_settings import tool_settings

if TYPE_CHECKING:
    import httpx

    from shared.api import OperatorInfo
    from shared.tls import CoordinatorTrust

ADMIN_TOKEN_ENV = "RL_ADMIN_TOKEN"
COORDINATOR_ENV = "RL_COORDINATOR_URL"
REQUEST_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser, default_run_dir: Path) -> None:
    common = argparse.ArgumentParser(add_help=False)  # each action takes them, after its own arguments too
    common.add_argument(
        "--coordinator",
        default=tool_settings("relay-rl operators").coordinator_url,
        help=f"the coordinator's base URL (default ${COORDINATOR_ENV}, else the one in <run dir>/cluster.env)",
    )
    common.add_argument(
        "--run-dir", type=Path, default=default_run_dir, help="a local cluster's run folder (default runs/latest)"
    )
    budget_flags = argparse.ArgumentParser(add_help=False)  # issue and budget take them
    budget_flags.add_argument("--max-workers", type=int, help="live workers it may hold at once")
    budget_flags.add_argument("--max-leases", type=int, help="task leases its workers may hold together")
    budget_flags.add_argument("--registrations-per-min", type=float, help="registrations and rejoins a minute")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = actions.add_parser(
        "issue",
        parents=[common, budget_flags],
        help="a new join credential; prints its id and join token (shown once)",
    )
    issue.add_argument("name", help="whom it is for (a label)")
    actions.add_parser("list", parents=[common], help="every credential: its state, budget, workers and record")
    budget = actions.add_parser(
        "budget", parents=[common, budget_flags], help="set a credential's budget (the flags given; others stay)"
    )
    budget.add_argument("operator_id", help="the credential's id (op-...)")
    release = actions.add_parser(
        "release", parents=[common], help="let a quarantined credential back in, and its quarantined workers"
    )
    release.add_argument("operator_id", help="the credential's id (op-...)")
    revoke = actions.add_parser(
        "revoke", parents=[common], help="refuse a credential from now on; its live workers are drained"
    )
    revoke.add_argument("operator_id", help="the credential's id (op-...)")


def main(args: argparse.Namespace) -> None:
    import httpx

    url, admin_token, trust = coordinator_and_admin_token(args.coordinator, args.run_dir)
    try:  # the admin token crosses only TLS off loopback (shared/tls.py)
        verify = trust.verify_for(url)
    except ValueError as exc:
        sys.exit(f"relay-rl operators: {exc}")
    headers = {"Authorization": f"Bearer {admin_token}"}
    try:
        with httpx.Client(base_url=url, headers=headers, timeout=REQUEST_TIMEOUT_S, verify=verify) as client:
            print(run_action(client, args))
    except httpx.HTTPError as exc:
        sys.exit(f"relay-rl operators: cannot reach the coordinator at {url}: {exc}")


def run_action(client: httpx.Client, args: argparse.Namespace) -> str:
    """One action against the coordinator; returns what to print (exits with the coordinator's reason on an error)."""
    from shared.api import OPERATORS_PATH, IssuedOperator, OperatorInfo, RevokedOperator

    if args.action == "issue":
        body: dict[str, object] = {"name": args.name}
        if budget := budget_fields(args):
            body["budget"] = budget
        issued = IssuedOperator.model_validate_json(expect(client.post(OPERATORS_PATH, json=body), 201))
        return (
            f"issued {issued.operator.operator_id} for {issued.operator.name} ({render_budget(issued.operator)}); "
            f"its join token (shown once):\n{issued.join_token}\n"
            f"its workers: relay-rl worker --coordinator {client.base_url} --token={issued.join_token}"
        )
    if args.action == "list":
        raw = expect(client.get(OPERATORS_PATH), 200)
        from pydantic import TypeAdapter

        return render_operators(TypeAdapter(list[OperatorInfo]).validate_json(raw))
    if args.action == "budget":
        if not budget_fields(args):
            sys.exit(
                "relay-rl operators budget: give at least one of --max-workers, --max-leases, --registrations-per-min"
            )
        path = f"{OPERATORS_PATH}/{args.operator_id}"
        operator = OperatorInfo.model_validate_json(expect(client.patch(path, json=budget_fields(args)), 200))
        return f"{operator.operator_id} ({operator.name}): {render_budget(operator)}"
    if args.action == "release":
        path = f"{OPERATORS_PATH}/{args.operator_id}/release"
        operator = OperatorInfo.model_validate_json(expect(client.post(path), 200))
        return f"released {operator.operator_id} ({operator.name}): {operator.state.value}"
    revoked = RevokedOperator.model_validate_json(expect(client.delete(f"{OPERATORS_PATH}/{args.operator_id}"), 200))
    drained = ", ".join(revoked.drained_worker_ids) or "none"
    return f"revoked {revoked.operator.operator_id} ({revoked.operator.name}); workers drained: {drained}"


def budget_fields(args: argparse.Namespace) -> dict[str, object]:
    """The budget flags given (CredentialBudgetUpdate's fields)."""
    fields = {"max_workers": args.max_workers, "max_leases": args.max_leases}
    fields["registrations_per_min"] = args.registrations_per_min
    return {name: value for name, value in fields.items() if value is not None}


def render_budget(operator: OperatorInfo) -> str:
    budget = operator.budget
    if budget is None:
        return "budget unknown"
    return (
        f"up to {budget.max_workers} workers, {budget.max_leases} leases, "
        f"{budget.registrations_per_min:g} registrations a minute"
    )


def render_operators(operators: list[OperatorInfo]) -> str:
    if not operators:
        return "no join credentials issued (workers use the cluster's shared join token)"
    lines = [f"{'id':<16} {'name':<20} {'state':<12} {'budget':<22} {'scored/judged':<14} live workers"]
    for operator in operators:
        workers = ", ".join(operator.worker_ids) or "-"
        why = ""
        if operator.quarantined_worker_ids:
            why = f" (held by quarantined {', '.join(operator.quarantined_worker_ids)})"
        elif operator.quarantine_reason:
            why = f" ({operator.quarantine_reason})"
        budget = "-" if operator.budget is None else f"{operator.budget.max_workers} w, {operator.budget.max_leases} l"
        record = operator.record
        judged = (
            "-"
            if record is None
            else f"{record.scored}/{record.scored + record.rejected + record.expired + record.failed}"
        )
        lines.append(
            f"{operator.operator_id:<16} {operator.name:<20} {operator.state.value:<12} {budget:<22} {judged:<14} "
            f"{workers}{why}"
        )
    return "\n".join(lines)


def expect(response: httpx.Response, status_code: int) -> bytes:
    if response.status_code != status_code:
        sys.exit(f"relay-rl operators: HTTP {response.status_code}: {response.text[:300]}")
    return response.content


def coordinator_and_admin_token(explicit_url: str | None, run_dir: Path) -> tuple[str, str, CoordinatorTrust]:
    """--coordinator / $RL_COORDINATOR_URL and $RL_ADMIN_TOKEN, each else from <run dir>/cluster.env; and how the
    coordinator is verified ($RL_COORDINATOR_CA_FILE / _CERT_SHA256 / $RL_INSECURE_HTTP, else cluster.env's)."""
    from cluster.join import cluster_trust, read_cluster_env

    url, admin_token = explicit_url, tool_settings("relay-rl operators").admin_token_value()
    cluster: dict[str, str] = {}
    if not url or not admin_token:
        try:
            cluster = read_cluster_env(run_dir)
        except ValueError as exc:
            sys.exit(f"relay-rl operators: no --coordinator/${ADMIN_TOKEN_ENV} and {exc}")
        url, admin_token = url or cluster[COORDINATOR_ENV], admin_token or cluster[ADMIN_TOKEN_ENV]
    return url.rstrip("/"), admin_token, cluster_trust(cluster)
