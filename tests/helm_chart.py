"""Render deploy/relay-rl with the real `helm template` and read what came out: the objects, each pod
template's containers, and a container's environment resolved the way the kubelet resolves it (Secret
and ConfigMap references, the downward API, `$(VAR)` expansion).

helm is found on PATH or beside this Python (`make k8s-render` installs it into .venv/bin). Where it is
missing a test skips, unless RL_REQUIRE_K8S_RENDER=1 (`make k8s-validate`, .ci/run): then it fails, so
a CI without the renderer can never pass as skipped chart tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART = REPO_ROOT / "deploy" / "relay-rl"
VALUES = REPO_ROOT / "deploy" / "values"
RELEASE = "rl"
POD_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "Job")
# what the downward API gives a pod at run time (fieldRef): stand-ins that look like the real thing
FIELD_REFS = {"metadata.name": "rl-relay-rl-worker-5d8f7c9b4-x2x9k", "status.podIP": "10.244.1.7"}
_VAR_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def helm_binary() -> str:
    found = shutil.which("helm") or shutil.which("helm", path=str(Path(sys.executable).parent))
    if found:
        return found
    if os.environ.get("RL_REQUIRE_K8S_RENDER") == "1":
        pytest.fail("RL_REQUIRE_K8S_RENDER=1 but no helm on PATH or in .venv/bin (make k8s-render installs it)")
    pytest.skip("helm is not installed: `make k8s-validate` installs it and runs these")


def secret_values(tmp_path: Path) -> Path:
    """A values file with every secret, fresh, from the script a user runs (deploy/make_secrets.py)."""
    path = tmp_path / "secrets.yaml"
    subprocess.run(
        [sys.executable, str(REPO_ROOT / "deploy" / "make_secrets.py"), "--out", str(path)], check=True, timeout=60
    )
    return path


def helm_template(args: Sequence[str], command: str = "template") -> subprocess.CompletedProcess[str]:
    """`helm template rl deploy/relay-rl ARGS` (or `helm lint deploy/relay-rl ARGS`)."""
    target = [RELEASE, str(CHART)] if command == "template" else [str(CHART)]
    return subprocess.run([helm_binary(), command, *target, *args], capture_output=True, text=True, timeout=120)


def render(values_files: Sequence[Path], run_config: Path, extra: Sequence[str] = ()) -> list[dict]:
    args = [arg for path in values_files for arg in ("-f", str(path))]
    result = helm_template([*args, "--set-file", f"runConfig={run_config}", *extra])
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


@dataclass(frozen=True)
class Container:
    """One container of a rendered pod template."""

    owner: dict  # the Deployment / StatefulSet / Job
    spec: dict
    init: bool

    @property
    def name(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}:{self.spec['name']}"

    @property
    def pod(self) -> dict:
        return self.owner["spec"]["template"]["spec"]

    @property
    def command(self) -> list[str]:
        return [*self.spec.get("command", []), *self.spec.get("args", [])]

    def port_names_and_numbers(self) -> set[str | int]:
        ports = self.spec.get("ports", [])
        return {port["containerPort"] for port in ports} | {port["name"] for port in ports if "name" in port}

    def mount_for(self, path: str) -> dict | None:
        """The volume mounted at the deepest mountPath holding `path`, or None."""
        mounts = [
            m
            for m in self.spec.get("volumeMounts", [])
            if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        if not mounts:
            return None
        mount = max(mounts, key=lambda m: len(m["mountPath"]))
        (volume,) = [v for v in self.pod.get("volumes", []) if v["name"] == mount["name"]]
        return volume


def containers(objects: list[dict]) -> Iterator[Container]:
    for obj in objects:
        if obj["kind"] in POD_TEMPLATE_KINDS:
            pod = obj["spec"]["template"]["spec"]
            for spec in pod.get("initContainers", []):
                yield Container(obj, spec, init=True)
            for spec in pod["containers"]:
                yield Container(obj, spec, init=False)


def find(objects: list[dict], kind: str, name_suffix: str) -> dict:
    (found,) = [obj for obj in objects if obj["kind"] == kind and obj["metadata"]["name"].endswith(name_suffix)]
    return found


def secret_data(objects: list[dict]) -> dict[tuple[str, str], str]:
    """(Secret name, key) -> value of every rendered Secret."""
    return {
        (obj["metadata"]["name"], key): value
        for obj in objects
        if obj["kind"] == "Secret"
        for key, value in obj.get("stringData", {}).items()
    }


def resolved_env(container: Container, objects: list[dict]) -> dict[str, str]:
    """The container's environment as the kubelet builds it; a reference to a Secret key that was not
    rendered raises KeyError (so a test sees it)."""
    data = secret_data(objects)
    env: dict[str, str] = {}
    for entry in container.spec.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(str(entry["value"]), env)
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = data[(ref["name"], ref["key"])]
        elif "fieldRef" in entry["valueFrom"]:
            env[entry["name"]] = FIELD_REFS[entry["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"{container.name}: env {entry['name']} comes from {entry['valueFrom']}")
    return env


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)`: replaced by an earlier variable of the same container; left as is otherwise."""
    return _VAR_REFERENCE.sub(lambda match: env.get(match.group(1), match.group(0)), text)
