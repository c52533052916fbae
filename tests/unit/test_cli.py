"""The relay-rl command line (cluster/cli.py): every --help answers without importing torch, transformers,
vllm or fastapi; the console script points at its main; `bench` knows every benchmark the Makefile runs."""

from __future__ import annotations

import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

from cluster.bench_catalog import BENCHMARKS
from cluster.cli import main
from services.coordinator.__main__ import cluster_bootstrap
from services.coordinator.settings import CoordinatorSettings
from shared.config import load_run_config
from shared.run_file import read_run_file
from tests.help_imports import help_and_imports
from tests.weights_keys import PUBLIC_KEY_HEX

HEAVY_MODULES = {"torch", "transformers", "vllm", "fastapi", "uvicorn"}


@pytest.mark.parametrize(
    "args",
    [[], ["worker"], ["status"], ["bench"], ["keys"], ["drain"], ["demo"], ["model"], ["model", "get"], ["operators"]],
    ids=lambda args: " ".join(args) or "relay-rl",
)
def test_every_help_answers_without_importing_a_heavy_module(args: list[str], repo_root: Path) -> None:
    shown, imported = help_and_imports(["cluster.cli", *args], repo_root)
    assert imported, "no -X importtime output"
    assert not HEAVY_MODULES & imported, HEAVY_MODULES & imported
    if args == ["demo"]:  # everything after `demo` is cluster.local's: its own flags answer
        assert "--workers" in shown and "--model-dir" in shown


def test_the_console_script_is_relay_rl_and_runs_cluster_cli_main(repo_root: Path) -> None:
    scripts = tomllib.loads((repo_root / "pyproject.toml").read_text())["project"]["scripts"]
    module_name, _, function_name = scripts["relay-rl"].partition(":")
    assert getattr(importlib.import_module(module_name), function_name) is main


def test_bench_runs_every_benchmark_the_makefile_names(repo_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    makefile = (repo_root / "Makefile").read_text()
    named = set(re.findall(r"cluster\.cli\)? ?bench ([a-z0-9-]+)", makefile)) | set(
        re.findall(r"\$\(RELAY_RL\) bench ([a-z0-9-]+)", makefile)
    )
    assert len(named) >= 10 and named <= set(BENCHMARKS), named - set(BENCHMARKS)
    for bench in BENCHMARKS.values():
        assert importlib.util.find_spec(bench.module) is not None, bench.module
    main(["bench", "--list"])
    listed = capsys.readouterr().out
    assert all(name in listed for name in BENCHMARKS)


def test_an_unknown_argument_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--no-such-flag"])
    assert exit_info.value.code == 2 and "--no-such-flag" in capsys.readouterr().err


def test_the_coordinator_bootstrap_hands_out_no_redis_at_all(repo_root: Path) -> None:
    run_file = repo_root / "configs" / "demo.toml"
    settings = CoordinatorSettings(
        admin_token="admin-token-0123456789",
        join_token="join-token-0123456789",
        redis_url="redis://coordinator:secret-password@redis.internal:6379/0",
        run_config=run_file,
        weights_public_key=PUBLIC_KEY_HEX,
    )
    run = load_run_config(run_file, run_id="the-run")
    bootstrap = cluster_bootstrap(settings, run)
    assert bootstrap is not None
    assert "redis" not in bootstrap.model_dump_json().lower()  # workers go through the coordinator's work API
    assert bootstrap.run_id == "the-run" and tomllib.loads(bootstrap.run_config_toml) == read_run_file(run_file)
    assert cluster_bootstrap(settings.model_copy(update={"weights_public_key": None}), run) is None


def test_keys_compose_prints_only_the_env_file_and_never_overwrites_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`relay-rl keys --compose > .env` must be a valid .env (nothing but the secrets on stdout; its TLS files go
    to ./tls), and `--out` (what `make keys` runs) writes it 0600 and never changes a running cluster's
    (tests/unit/test_compose_keys.py: it only adds what is missing)."""
    monkeypatch.chdir(tmp_path)
    main(["keys", "--compose"])
    printed = capsys.readouterr().out
    variables = dict(line.split("=", 1) for line in printed.splitlines() if line and not line.startswith("#"))
    assert len(variables) == 9 and all(re.fullmatch(r"RL_[A-Z_]+", name) for name in variables)
    assert variables["RL_TLS_DIR"] == str(tmp_path.resolve() / "tls")
    assert all(value and " " not in value for value in variables.values())

    env_file = tmp_path / ".env"
    main(["keys", "--compose", "--out", str(env_file)])
    assert capsys.readouterr().out == ""
    assert env_file.stat().st_mode & 0o777 == 0o600
    written = env_file.read_text()
    main(["keys", "--compose", "--out", str(env_file)])
    assert env_file.read_text() == written
