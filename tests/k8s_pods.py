"""Run the rendered chart's containers on this machine as processes, where no cluster can: each container
keeps its command, environment and probes as rendered, with three things a cluster would provide made
local: a Service `name:port` becomes 127.0.0.1 and a free port per container port (wherever the port
appears: a URL, an RL_*_PORT variable, a command's argument), a volume becomes a folder (a ConfigMap
volume holds its files), and 0.0.0.0 and the pod's IP become 127.0.0.1.

Everything else (which user logs in to Redis with which password, where the run file and the model are
looked up, which port a probe asks) is what the chart says, unchanged.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from cluster.ports import free_port
from cluster.processes import ServiceProcess
from tests.helm_chart import FIELD_REFS, REPO_ROOT, Container, containers, expand, resolved_env

_LOCAL_HOST_PORT = re.compile(r"127\.0\.0\.1:(\d+)\b")


@dataclass
class LocalPods:
    objects: list[dict]
    root: Path
    # (owner name, container port) -> the free local port standing in for it
    ports: dict[tuple[str, int], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.service_addresses = {}  # "<service>:<port>" -> "127.0.0.1:<local port>"
        for service in [obj for obj in self.objects if obj["kind"] == "Service"]:
            component = service["spec"]["selector"]["app.kubernetes.io/component"]
            for port in service["spec"]["ports"]:
                target = self.container_port(component, port["targetPort"])
                owner, number = target
                self.service_addresses[f"{service['metadata']['name']}:{port['port']}"] = (
                    f"127.0.0.1:{self.local_port(owner, number)}"
                )

    def container_port(self, component: str, name: str) -> tuple[str, int]:
        for container in containers(self.objects):
            labels = container.owner["spec"]["template"]["metadata"]["labels"]
            if labels["app.kubernetes.io/component"] == component:
                for port in container.spec.get("ports", []):
                    if port.get("name") == name:
                        return container.owner["metadata"]["name"], port["containerPort"]
        raise AssertionError(f"no container of {component} exposes a port named {name}")

    def local_port(self, owner: str, container_port: int) -> int:
        return self.ports.setdefault((owner, container_port), free_port())

    def volume_dir(self, container: Container, volume_name: str) -> Path:
        path = self.root / container.owner["metadata"]["name"] / volume_name
        if not path.exists():
            path.mkdir(parents=True)
            claims = container.owner["spec"].get("volumeClaimTemplates", [])  # a StatefulSet's per-pod claims
            volumes = [v for v in container.pod.get("volumes", []) if v["name"] == volume_name]
            volumes += [{"name": c["metadata"]["name"]} for c in claims if c["metadata"]["name"] == volume_name]
            (volume,) = volumes
            if "configMap" in volume:
                (config_map,) = [
                    obj
                    for obj in self.objects
                    if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == volume["configMap"]["name"]
                ]
                for key, text in config_map["data"].items():
                    (path / key).write_text(text)
            if "secret" in volume:  # each key a file, as the kubelet mounts a Secret (the rendered stringData)
                (secret,) = [
                    obj
                    for obj in self.objects
                    if obj["kind"] == "Secret" and obj["metadata"]["name"] == volume["secret"]["secretName"]
                ]
                for key, text in secret.get("stringData", {}).items():
                    (path / key).write_text(text)
                for key, encoded in secret.get("data", {}).items():
                    (path / key).write_bytes(base64.b64decode(encoded))
        return path

    def localize(self, container: Container, text: str) -> str:
        """One env value or command argument with the cluster's addresses and paths made local."""
        for mount in sorted(container.spec.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            # the mount path where a path starts (not inside another path), followed by / or its end
            pattern = r"(?<![\w/.-])" + re.escape(mount["mountPath"].rstrip("/")) + r"(?=/|$|\s|\"|')"
            if re.search(pattern, text):
                local_dir = str(self.volume_dir(container, mount["name"]))
                text = re.sub(pattern, local_dir.replace("\\", "\\\\"), text)
        for address, local in self.service_addresses.items():
            text = text.replace(address, local)
        text = text.replace("0.0.0.0", "127.0.0.1").replace(FIELD_REFS["status.podIP"], "127.0.0.1")
        owner = container.owner["metadata"]["name"]
        exposed = {port["containerPort"] for port in container.spec.get("ports", [])}

        def local(match: re.Match[str]) -> str:
            number = int(match.group(1))
            return f"127.0.0.1:{self.local_port(owner, number)}" if number in exposed else match.group(0)

        return _LOCAL_HOST_PORT.sub(local, text)

    def env(self, container: Container) -> dict[str, str]:
        env = {}
        exposed = {str(port["containerPort"]) for port in container.spec.get("ports", [])}
        owner = container.owner["metadata"]["name"]
        for name, value in resolved_env(container, self.objects).items():
            if name.endswith("_PORT") and value in exposed:
                env[name] = str(self.local_port(owner, int(value)))
            else:
                env[name] = self.localize(container, value)
        return env

    def command(self, container: Container) -> list[str]:
        """The container's command, `$(VAR)` expanded with its environment (as the kubelet does)."""
        env = self.env(container)
        command = [expand(self.localize(container, arg), env) for arg in container.command]
        owner = container.owner["metadata"]["name"]
        exposed = {str(port["containerPort"]) for port in container.spec.get("ports", [])}
        # a flag's value that is one of the container's ports (relay-rl worker --port 8200): the local one
        command = [str(self.local_port(owner, int(arg))) if arg in exposed else arg for arg in command]
        return [*program(command[0]), *command[1:]]

    def run(self, container: Container, timeout_s: float = 120.0) -> None:
        """A container that runs to completion (an init container)."""
        subprocess.run(
            self.command(container),
            env={**image_env(), **self.env(container)},
            cwd=REPO_ROOT,
            check=True,
            timeout=timeout_s,
        )

    def start(self, container: Container) -> ServiceProcess:
        """A long-running container as a child process, its output in <root>/logs/<owner>.log."""
        log_path = self.root / "logs" / f"{container.owner['metadata']['name']}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log_file:
            popen = subprocess.Popen(
                self.command(container),
                env={**image_env(), **self.env(container)},
                cwd=REPO_ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return ServiceProcess(container.name, popen, log_path)

    def probe_passes(self, container: Container, probe_kind: str) -> bool:
        """One try of a rendered probe: httpGet against the local port, exec with the container's env."""
        probe = container.spec[probe_kind]
        owner = container.owner["metadata"]["name"]
        if "httpGet" in probe:
            port = probe["httpGet"]["port"]
            number = port if isinstance(port, int) else self.named_port(container, port)
            scheme = probe["httpGet"].get("scheme", "HTTP").lower()
            url = f"{scheme}://127.0.0.1:{self.local_port(owner, number)}{probe['httpGet']['path']}"
            try:
                # the kubelet does not verify an HTTPS probe's certificate
                response = httpx.get(url, verify=False)
            except httpx.HTTPError:
                return False
            return 200 <= response.status_code < 400
        command = [self.localize(container, arg) for arg in probe["exec"]["command"]]
        result = subprocess.run(
            [*program(command[0]), *command[1:]],
            env={**image_env(), **self.env(container)},
            capture_output=True,
            timeout=30,
        )
        return result.returncode == 0

    @staticmethod
    def named_port(container: Container, name: str) -> int:
        (number,) = [port["containerPort"] for port in container.spec["ports"] if port.get("name") == name]
        return number


def image_env() -> dict[str, str]:
    """What the image gives every container (Dockerfile ENV, its Python on PATH), without this shell's RL_*."""
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("RL_")}
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**inherited, "PATH": path, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def program(name: str) -> list[str]:
    """How to start the image's `name` here: `python` is this test's interpreter; `relay-rl` is the console
    script's target (pyproject: cluster.cli:main) from this checkout, whatever an environment has installed;
    anything else (sh) from PATH."""
    if name == "python":
        return [sys.executable]
    if name == "relay-rl":
        return [sys.executable, "-c", "from cluster.cli import main; main()"]
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed"
    return [found]
