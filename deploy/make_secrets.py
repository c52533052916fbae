"""Fresh secrets for the Helm chart as a values file: the workers' join credential and the admin token, a new
Ed25519 pair for weight manifests, and one Redis password per trusted user. Keep the file private (mode 0600).

    .venv/bin/python deploy/make_secrets.py --out my-secrets.yaml
    helm install rl deploy/relay-rl -f deploy/values/cpu-demo.yaml -f my-secrets.yaml --set-file runConfig=configs/demo.toml

The workers' join credential (`secrets.operatorToken`, op-<id>.<secret>) is an operator credential the coordinator
provisions at start (RL_OPERATOR_TOKENS): the chart's workers send it; there is no shared join token. A worker on
another machine gets a credential of its own: `relay-rl operators issue NAME` (docs/kubernetes.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> None:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere
    from cluster.secrets import ClusterSecrets, write_private

    parser = argparse.ArgumentParser(prog="python deploy/make_secrets.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the values file to write (mode 0600)")
    args = parser.parse_args(argv)
    # JSON is YAML: no YAML library needed here
    text = "# relay-rl secrets: keep private\n" + json.dumps(ClusterSecrets.generate().helm_values(), indent=2) + "\n"
    write_private(args.out, text, overwrite=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
