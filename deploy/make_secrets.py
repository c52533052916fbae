"""Fresh secrets for the Helm chart as a values file: the join and admin tokens, a new Ed25519 pair for
weight manifests, and one Redis password per trusted user. Keep the file private (mode 0600).

    .venv/bin/python deploy/make_secrets.py --out my-secrets.yaml
    helm install rl deploy/relay-rl -f deploy/values/cpu-demo.yaml -f my-secrets.yaml --set-file runConfig=configs/demo.toml

A worker on another machine needs only the join token (`secrets.joinToken`) and the coordinator's URL.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
REDIS_USERS = ("coordinator", "reward", "learner", "operator")  # cluster/redis_acl.py: TRUSTED_SERVICES + OPERATOR


def new_secrets() -> dict[str, object]:
    sys.path.insert(0, str(REPO_ROOT))  # run as a script from anywhere
    from shared.signing import generate_key_pair

    pair = generate_key_pair()
    return {
        "secrets": {
            "create": True,
            # hex: never begins with "-" (which a command line would take for a flag) and needs no quoting
            "joinToken": secrets.token_hex(24),
            "adminToken": secrets.token_hex(24),
            "weightsPublicKey": pair.public_key_hex,
            "signingKey": pair.signing_key_hex,
            # hex is URL-safe: each goes into its service's redis://user:password@host URL as it is
            "redisPasswords": {user: secrets.token_hex(24) for user in REDIS_USERS},
        }
    }


def write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python deploy/make_secrets.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the values file to write (mode 0600)")
    args = parser.parse_args(argv)
    # JSON is YAML: no YAML library needed here
    write_private(args.out, "# relay-rl secrets: keep private\n" + json.dumps(new_secrets(), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
