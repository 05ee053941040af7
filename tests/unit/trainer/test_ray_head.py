"""The local Ray head's token and its start-up failures (no Ray started here: the e2e tests
start one on an empty HOME)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainer.ray_head import LocalRayHead, explain_exit, has_user_token

CLEAN = {"RAY_AUTH_TOKEN": None, "RAY_AUTH_TOKEN_PATH": None}


def _head(env: dict[str, str | None]) -> LocalRayHead:
    head = LocalRayHead(num_cpus=1, env=env)
    return head


def test_without_a_user_token_the_head_makes_one_of_its_own(tmp_path: Path) -> None:
    head = _head({**CLEAN, "HOME": str(tmp_path)})
    try:
        assert head.token_path is not None and head.token_path.parent == head.temp_dir
        assert head.token_path.stat().st_mode & 0o777 == 0o600
        assert head.env["RAY_AUTH_TOKEN_PATH"] == str(head.token_path)
        assert head.auth_env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(head.token_path)}
        assert head.token_path.read_text() not in head.usage_line()
        assert "--node-ip-address=127.0.0.1" in head.command()
        assert "--dashboard-host=127.0.0.1" in head.command()
        other = _head({**CLEAN, "HOME": str(tmp_path)})
        assert other.token_path is not None
        assert other.token_path.read_text() != head.token_path.read_text()  # random per head
        shutil.rmtree(other.temp_dir)
    finally:
        head.stop()
    assert not head.temp_dir.exists()  # the token goes with the head


@pytest.mark.parametrize("given", ["env", "path", "home"])
def test_a_users_own_token_is_used_as_it_is(tmp_path: Path, given: str) -> None:
    token = tmp_path / "tok"
    token.write_text("a" * 64)
    env: dict[str, str | None] = {**CLEAN, "HOME": str(tmp_path)}
    if given == "env":
        env["RAY_AUTH_TOKEN"] = "b" * 64
    elif given == "path":
        env["RAY_AUTH_TOKEN_PATH"] = str(token)
    else:
        (tmp_path / ".ray").mkdir()
        (tmp_path / ".ray" / "auth_token").write_text("c" * 64)
    assert has_user_token({k: v for k, v in env.items() if v is not None})
    head = _head(env)
    try:
        assert head.token_path is None
        assert not (head.temp_dir / "auth_token").exists()
        assert head.env.get("RAY_AUTH_TOKEN_PATH") == env.get("RAY_AUTH_TOKEN_PATH")
    finally:
        head.stop()


def test_an_auth_failure_says_so_and_is_not_read_as_a_port_clash(tmp_path: Path) -> None:
    log = ("2026-12-01 ... ERROR\nray.exceptions.AuthenticationError: Token authentication is "
           "enabled but no authentication token was found. ...\n")
    e = explain_exit(log, log_path=tmp_path / "head.log")
    assert not e.port_clash
    assert "token authentication is on" in e.reason and "RAY_AUTH_TOKEN_PATH" in e.reason
    assert "\n" not in e.reason and str(tmp_path / "head.log") in e.reason


def test_a_port_clash_is_the_only_thing_retried(tmp_path: Path) -> None:
    clash = explain_exit("ValueError: Failed to bind to 127.0.0.1:8265 because it's already "
                         "occupied.\n", log_path=tmp_path / "l")
    assert clash.port_clash and "8265" in clash.reason
    other = explain_exit("Usage stats ...\nRuntimeError: something else broke\nbye\n",
                         log_path=tmp_path / "l")
    assert not other.port_clash and "something else broke" in other.reason
    assert "(empty log)" in explain_exit("", log_path=tmp_path / "l").reason


def test_an_early_exit_raises_at_once_with_the_cause(tmp_path: Path) -> None:
    """A head whose token file is unreadable: one clear error, not three port retries."""
    head = _head({**CLEAN, "HOME": str(tmp_path), "RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")})
    with pytest.raises(RuntimeError) as info:
        head.start(timeout_s=60)
    msg = str(info.value)
    assert "ray start failed 3 times" not in msg
    assert "token" in msg.lower() and "\n" not in msg
