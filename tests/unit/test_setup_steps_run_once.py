"""The compose file's one-shot set-up steps (init-model, redis-acl) run again on every `docker compose up`,
including under a live cluster: each must leave what is already there untouched."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cluster.redis_acl import RedisUsers
from services.learner.model_init import POLICY_FILES, build_initial_policy
from shared.config import ModelConfig


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_a_second_model_build_leaves_the_policy_folder_untouched(tmp_path: Path) -> None:
    model = ModelConfig(max_position_embeddings=32)
    out = build_initial_policy(model, "abc +=0123456789", tmp_path / "model")
    assert all((out / name).exists() for name in POLICY_FILES)
    before = _snapshot(out)
    build_initial_policy(model, "abc +=0123456789", out)
    assert _snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # no building folder left behind


def test_a_model_build_refuses_a_folder_holding_part_of_a_policy(tmp_path: Path) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(FileExistsError, match="not a whole policy"):
        build_initial_policy(ModelConfig(max_position_embeddings=32), "abc", out)
    assert [p.name for p in out.iterdir()] == ["config.json"]


def test_the_acl_file_is_rewritten_only_when_its_users_change(tmp_path: Path) -> None:
    path = tmp_path / "users.acl"
    users = RedisUsers("compose")
    assert users.write_acl_file(path) is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = (path.read_text(), path.stat().st_mtime_ns, path.stat().st_ino)

    same = RedisUsers("compose", passwords=dict(users.passwords))
    assert same.write_acl_file(path) is False
    assert (path.read_text(), path.stat().st_mtime_ns, path.stat().st_ino) == written

    changed = RedisUsers("compose", passwords={**users.passwords, "learner": "another-password"})
    assert changed.write_acl_file(path) is True
    assert path.read_text() != written[0] and path.stat().st_ino != written[2]  # replaced, not truncated
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["users.acl"]
