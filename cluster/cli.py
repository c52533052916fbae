"""relay-rl: the command line of the cluster (installed by the package; `python -m cluster.cli` is the same).

    relay-rl demo [cluster.local flags]          the whole cluster on this machine (make demo)
    relay-rl worker --coordinator URL --token T  a rollout worker that joins a running cluster from anywhere
    relay-rl drain NAME_OR_ID                    drain a worker of the local cluster (make drain)
    relay-rl operators issue|list|revoke         join credentials quarantine sticks to (admin token)
    relay-rl status [--json]                     the run at a glance: learner step, reward, workers by state
    relay-rl bench NAME [ARGS] | --list          the benchmarks the Makefile runs (make bench-*)
    relay-rl keys [--compose] [--out .env]       a new Ed25519 pair; --compose: every secret compose needs (make keys)
                  [--tls-host NAME ...]          and a run CA + coordinator certificate for those names (tls/)
    relay-rl model get NAME | list               a pretrained base from the catalog, converted once (make model)

`relay-rl COMMAND --help` says more. Only the standard library is imported before the arguments are
parsed, so every --help answers at once; each command imports what it needs when it runs.
Docs: docs/cli.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# standard library only at module level (each defers its heavy imports to when it runs): --help stays instant
from cluster import bench_catalog, model_cache, operators, remote_worker, status_view
from cluster.checkout import source_checkout
from cluster.join import DEFAULT_RUN_DIR, REPO_ROOT

# the names compose's coordinator is reached at: its service name (the workers), this machine (its healthcheck,
# `relay-rl worker` here); `relay-rl keys --compose --tls-host` adds the address other machines use
COMPOSE_TLS_HOSTS = ("coordinator", "localhost", "127.0.0.1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relay-rl", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo", add_help=False, help="the local cluster; every argument goes to cluster.local (relay-rl demo --help)"
    )
    worker = commands.add_parser(
        "worker",
        help="start a rollout worker that joins a running cluster (settings from the coordinator)",
        description=remote_worker.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    remote_worker.add_arguments(worker)
    drain = commands.add_parser(
        "drain",
        help="drain a worker of the local cluster: it finishes its batch, deregisters and exits 0",
        description="python -m cluster.drain: the admin token and coordinator come from <run dir>/cluster.env.",
    )
    drain.add_argument("worker", help="worker name (as shown by relay-rl status and the dashboard) or id")
    drain.add_argument(
        "--run-dir", type=Path, default=DEFAULT_RUN_DIR, help="the cluster's run folder (default runs/latest)"
    )
    operators_parser = commands.add_parser(
        "operators",
        help="join credentials for operators (issue, list, revoke): quarantine sticks to them",
        description=operators.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    operators.add_arguments(operators_parser, DEFAULT_RUN_DIR)
    status = commands.add_parser("status", help="the run at a glance (GET /v1/status)", description=status_view.__doc__)
    status_view.add_arguments(status, DEFAULT_RUN_DIR)
    bench = commands.add_parser(
        "bench",
        help="run a benchmark of the Makefile's (relay-rl bench --list)",
        description=bench_catalog.__doc__,
        epilog="benchmarks:\n" + bench_catalog.list_text(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_argument("name", nargs="?", choices=sorted(bench_catalog.BENCHMARKS), metavar="NAME")
    bench.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    keys = commands.add_parser(
        "keys",
        help="print a new Ed25519 pair: RL_SIGNING_KEY (learner only), RL_WEIGHTS_PUBLIC_KEY; --compose: every secret",
    )
    keys.add_argument(
        "--compose", action="store_true", help="every variable docker-compose.yml requires, as a .env file"
    )
    keys.add_argument(
        "--out",
        type=Path,
        help="write to this file (mode 0600); an existing one is an error, but with --compose it gets the variables "
        "it lacks and keeps every value it has",
    )
    keys.add_argument(
        "--tls-host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="a name or address the coordinator is reached at: makes a run CA (ca.pem), the coordinator's certificate "
        "for every --tls-host (server.pem) and its key (server.key, 0600) in --tls-dir; repeatable. --compose "
        f"always makes them, for {', '.join(COMPOSE_TLS_HOSTS)} and these",
    )
    keys.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="where the TLS files go (default: tls/ beside --out, else ./tls); a whole set there is kept as it is",
    )
    model = commands.add_parser(
        "model",
        help="a pretrained base from the catalog: get (fetch, convert, check; prints its folder) or list",
        description=model_cache.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model_cache.add_arguments(model)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # every argument after it is cluster.local's, handed over as it is
        run_demo(argv[1:])
        return
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command != "bench":  # only a benchmark takes arguments of its own
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "worker":
        remote_worker.main(args)
    elif args.command == "drain":
        from cluster.drain import main as drain_main

        drain_main([args.worker, "--run-dir", str(args.run_dir)])
    elif args.command == "operators":
        operators.main(args)
    elif args.command == "status":
        status_view.main(args)
    elif args.command == "bench":
        if args.list or args.name is None:
            print(bench_catalog.list_text())
            return
        bench_catalog.run(args.name, extra)
    elif args.command == "keys":
        print_keys(args.compose, args.out, args.tls_host, args.tls_dir)
    elif args.command == "model":
        model_cache.main(args)


def print_keys(compose: bool, out: Path | None, tls_hosts: Sequence[str] = (), tls_dir: Path | None = None) -> None:
    """`relay-rl keys [--compose] [--out FILE] [--tls-host NAME ...] [--tls-dir DIR]`: only the secrets go to stdout
    (so `> .env` is safe); the TLS files go to their folder, what was done to stderr."""
    from cluster.secrets import (
        TLS_DIR_VARIABLE,
        ClusterSecrets,
        add_missing_compose_env,
        env_file_values,
        write_private,
    )

    secrets = ClusterSecrets.generate()
    if tls_dir is None and compose and out is not None and out.exists():  # the folder the running cluster uses
        tls_dir = Path(env_file_values(out.read_text()).get(TLS_DIR_VARIABLE) or out.parent / "tls")
    tls_dir = tls_dir or (out.parent if out is not None else Path()) / "tls"
    if compose or tls_hosts:
        make_tls_files(tls_dir, [*(COMPOSE_TLS_HOSTS if compose else ()), *tls_hosts])
    if compose and out is not None and out.exists():  # a running cluster's, maybe: complete it, change nothing
        try:
            added = add_missing_compose_env(out, secrets, tls_dir)
        except ValueError as error:
            sys.exit(str(error))
        print(f"{out} exists: its values kept; added {', '.join(added) or 'nothing'}", file=sys.stderr)
        return
    if compose:
        text = secrets.compose_env_text(tls_dir)
    else:
        text = f"RL_SIGNING_KEY={secrets.signing_key}\nRL_WEIGHTS_PUBLIC_KEY={secrets.weights_public_key}\n"
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_private(out, text)
    except FileExistsError as error:
        sys.exit(str(error))
    print(f"wrote {out} (mode 0600): {len(text.splitlines())} lines", file=sys.stderr)


def make_tls_files(tls_dir: Path, hosts: Sequence[str]) -> None:
    """The run CA and the coordinator's certificate for `hosts` in `tls_dir` (a whole set there is kept: it may be
    a running cluster's); says on stderr what was done and the certificate's SHA-256, what a worker may pin."""
    from cluster.tls import existing_or_new_certificates

    try:
        files, made = existing_or_new_certificates(tls_dir, hosts)
    except ValueError as error:
        sys.exit(str(error))
    what = f"made for {', '.join(dict.fromkeys(hosts))}" if made else "kept (remove the folder to make a new set)"
    print(
        f"TLS in {tls_dir}: ca.pem (workers: RL_COORDINATOR_CA_FILE), server.pem and server.key (0600; the "
        f"coordinator: RL_TLS_CERT_FILE, RL_TLS_KEY_FILE) {what}; certificate sha256 {files.cert_sha256} "
        "(RL_COORDINATOR_CERT_SHA256 pins it)",
        file=sys.stderr,
    )


def run_demo(args: list[str]) -> None:
    """`relay-rl demo ...` is `python -m cluster.local ...` (with a progress bar on a terminal)."""
    from cluster import local
    from cluster.demo_progress import demo_progress_bar

    # cluster.local's parser reads sys.argv: its flags (others add their own there) stay its business
    sys.argv = ["relay-rl demo", *args]
    if {"-h", "--help"} & set(args):
        local.main()
        return
    source_checkout("demo")
    with demo_progress_bar(REPO_ROOT / "runs"):
        local.main()


if __name__ == "__main__":
    main()
