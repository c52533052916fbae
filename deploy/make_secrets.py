"""Fresh secrets for the Helm chart as a values file: the workers' join credential and the admin token, a new
Ed25519 pair for weight manifests, one Redis password per trusted user, and the coordinator's TLS: a run CA and a
certificate for its Service name (cluster/tls.py). Keep the file private (mode 0600).

    .venv/bin/python deploy/make_secrets.py --out my-secrets.yaml [--release rl] [--tls-host coord.example.com]
    helm install rl deploy/relay-rl -f deploy/values/cpu-demo.yaml -f my-secrets.yaml --set-file runConfig=configs/demo.toml

The certificate names the coordinator's Service in the release (`--release`, the name given to helm install:
<fullname>-coordinator), localhost and 127.0.0.1 (kubectl port-forward), and each --tls-host: the address workers
outside the cluster reach it at. The CA's private key is never written: another name needs a new file.

The workers' join credential (`secrets.operatorToken`, op-<id>.<secret>) is an operator credential the coordinator
provisions at start (RL_OPERATOR_TOKENS): the chart's workers send it; there is no shared join token. A worker on
another machine gets a credential of its own: `relay-rl operators issue NAME` (docs/kubernetes.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_NAME = "relay-rl"


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere
    from cluster.secrets import ClusterSecrets, write_private
    from cluster.tls import make_run_certificates

    parser = argparse.ArgumentParser(prog="python deploy/make_secrets.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the values file to write (mode 0600)")
    parser.add_argument(
        "--release", default="rl", help="the release name helm install is given (default rl): its Service's name"
    )
    parser.add_argument(
        "--tls-host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="another name or address of the coordinator's certificate (repeatable): where outside workers reach it",
    )
    args = parser.parse_args(argv)
    hosts = [f"{chart_fullname(args.release)}-coordinator", "localhost", "127.0.0.1", *args.tls_host]
    with tempfile.TemporaryDirectory() as folder:  # the files are inlined in the values; the folder goes
        tls = make_run_certificates(Path(folder), hosts)
        values = ClusterSecrets.generate().helm_values(tls)
    # JSON is YAML: no YAML library needed here
    text = "# relay-rl secrets: keep private\n" + json.dumps(values, indent=2) + "\n"
    write_private(args.out, text, overwrite=True)
    print(f"wrote {args.out}: the coordinator's certificate for {', '.join(hosts)}, sha256 {tls.cert_sha256}")


def chart_fullname(release: str) -> str:
    """The chart's <fullname> for a release name (deploy/relay-rl/templates/_helpers.tpl relay-rl.fullname)."""
    name = release if CHART_NAME in release else f"{release}-{CHART_NAME}"
    return name[:40].removesuffix("-")


if __name__ == "__main__":
    main()
