"""Fresh secrets for the Helm chart as a values file: the join and admin tokens, a new Ed25519 pair for
weight manifests, and one Redis password per trusted user. Keep the file private (mode 0600).

    .venv/bin/python deploy/make_secrets.py --out my-secrets.yaml
    helm install rl deploy/relay-rl -f deploy/values/cpu-demo.yaml -f my-secrets.yaml --set-file runConfig=configs/demo.toml

A worker on another machine needs only the join token (`secrets.joinToken`) and the coordinator's URL.
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
