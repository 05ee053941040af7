"""Token files: the reward server's bearer token read from ``$REWARD_SERVER_TOKEN_FILE`` by every
process that sends or checks it (client verbs, the trainer, the verl integration, the server's
config), and the token files we make or use kept to their owner (0600): ours, and Ray's
``~/.ray/auth_token`` where we start a head (trainer/ray_head.py, deploy/commands.sh, the
embedded Ray of ``reward-server serve``)."""

from __future__ import annotations

import argparse
import os
import stat
import subprocess
from pathlib import Path

import pytest

from reward_server.client import TOKEN_FILE_ENV, TokenFileError, bearer_token
from reward_server.config import load_config
from reward_server.serving.ray_cluster import private_ray_token
from trainer.ray_head import LocalRayHead

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "f00d" * 16


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- reading the server's token
def test_the_token_comes_from_the_file_named_by_the_environment(tmp_path: Path) -> None:
    path = token_file(tmp_path)
    assert bearer_token(environ={TOKEN_FILE_ENV: str(path)}) == TOKEN  # newline stripped
    assert bearer_token(environ={"REWARD_SERVER_TOKEN": "v", TOKEN_FILE_ENV: str(path)}) == "v"
    assert bearer_token(environ={}) is None
    # any variable that holds a token has its _FILE (verl's reward_kwargs.token_env)
    assert bearer_token("MY_TOKEN", environ={"MY_TOKEN_FILE": str(path)}) == TOKEN


@pytest.mark.parametrize(("make", "says"), [
    (lambda p: p / "missing", "no such file"),
    (lambda p: token_file(p, text=" \n"), "the file is empty"),
    (lambda p: p, "cannot read it"),  # a folder
])
def test_a_named_file_that_gives_no_token_says_what_and_how(tmp_path: Path, make, says) -> None:  # type: ignore[no-untyped-def]
    path = make(tmp_path)
    with pytest.raises(TokenFileError, match=says) as e:
        bearer_token(environ={TOKEN_FILE_ENV: str(path)})
    assert f"${TOKEN_FILE_ENV}={path}" in str(e.value) and "\n" not in str(e.value)


def test_a_file_others_can_read_is_named_with_the_chmod(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    path = token_file(tmp_path, mode=0o644)
    for _ in range(2):
        assert bearer_token(environ={TOKEN_FILE_ENV: str(path)}) == TOKEN
    warned = [r.getMessage() for r in caplog.records if "readable by other users" in r.getMessage()]
    assert warned == [f"${TOKEN_FILE_ENV}={path} is readable by other users (mode -rw-r--r--): "
                      f"chmod 600 {path}"]  # once


def test_the_server_reads_the_file_for_its_auth_token(tmp_path: Path) -> None:
    config = load_config(env={TOKEN_FILE_ENV: str(token_file(tmp_path))})
    assert config.server.auth_token is not None
    assert config.server.auth_token.get_secret_value() == TOKEN
    with pytest.raises(TokenFileError, match="no such file"):
        load_config(env={TOKEN_FILE_ENV: str(tmp_path / "nope")})


def test_the_trainer_reads_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.run import UserError, server_token

    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file(tmp_path)))
    assert server_token() == TOKEN
    monkeypatch.setenv(TOKEN_FILE_ENV, str(tmp_path / "nope"))
    with pytest.raises(UserError, match="no such file"):  # one line, exit 2
        server_token()


def test_verl_reads_the_file_of_its_token_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    from trainer.verl_runner import _address_and_token

    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file(tmp_path)))
    config = OmegaConf.create({"reward": {"custom_reward_function": {"reward_kwargs": {
        "reward_server": "h:1", "token_env": "REWARD_SERVER_TOKEN"}}}})
    assert _address_and_token(config) == ("h:1", TOKEN)


async def test_the_cli_reads_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a running loop, as the CLI makes its client (an aio channel needs one; a sync test
    failed in the full suite once an earlier test had left the main thread with no loop)."""
    from reward_server.cli import _client

    monkeypatch.delenv("REWARD_SERVER_TOKEN", raising=False)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(token_file(tmp_path)))
    async with _client(argparse.Namespace(token=None, target="127.0.0.1:1", timeout=1.0)) as c:
        assert dict(c._metadata)["authorization"] == f"Bearer {TOKEN}"


# ---------------------------------------------------------------- 0600
def ray_token(home: Path, file_mode: int) -> Path:
    path = home / ".ray" / "auth_token"
    path.parent.mkdir(parents=True)
    path.write_text("ab" * 32)
    path.chmod(file_mode)
    return path


def test_the_embedded_ray_token_is_made_0600_in_a_0700_folder(tmp_path: Path) -> None:
    path = private_ray_token({}, home=tmp_path)  # RAY_AUTH_MODE unset: Ray's default is token
    assert path == tmp_path / ".ray" / "auth_token"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert len(path.read_text()) == 64 and int(path.read_text(), 16) >= 0  # as Ray makes them
    made = path.read_text()
    assert private_ray_token({}, home=tmp_path) == path and path.read_text() == made  # kept


def test_an_existing_ray_token_others_can_read_is_made_0600(tmp_path: Path) -> None:
    path = ray_token(tmp_path, 0o644)  # what `ray get-auth-token --generate` leaves
    assert private_ray_token({"RAY_AUTH_MODE": "token"}, home=tmp_path) == path
    assert mode(path) == 0o600
    named = token_file(tmp_path, mode=0o640)
    assert private_ray_token({"RAY_AUTH_TOKEN_PATH": str(named)}, home=tmp_path) == named
    assert mode(named) == 0o600


def test_no_token_file_when_auth_is_off_or_the_token_is_a_value(tmp_path: Path) -> None:
    assert private_ray_token({"RAY_AUTH_MODE": "disabled"}, home=tmp_path) is None
    assert private_ray_token({"RAY_AUTH_TOKEN": "x"}, home=tmp_path) is None
    assert not (tmp_path / ".ray").exists()


def test_the_local_head_makes_the_users_ray_token_0600(tmp_path: Path) -> None:
    path = ray_token(tmp_path, 0o644)
    head = LocalRayHead(num_cpus=1, env={"HOME": str(tmp_path), "RAY_AUTH_TOKEN": None,
                                         "RAY_AUTH_TOKEN_PATH": None})
    try:
        assert head.token_path is None  # the user's own token is used
        assert mode(path) == 0o600
    finally:
        head.stop()


def test_commands_sh_makes_the_token_files_it_is_given_0600(tmp_path: Path) -> None:
    path = token_file(tmp_path, mode=0o644)
    proc = subprocess.run([str(ROOT / "deploy" / "commands.sh"), "worker"],
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path),
                               "RAY_AUTH_TOKEN_PATH": str(path)},
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "RAY_HEAD_ADDRESS" in proc.stderr  # stops there, after
    assert mode(path) == 0o600 and f"{path} was readable by other users" in proc.stderr
