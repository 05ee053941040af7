"""User mistakes, made as a user makes them (subprocesses of ``trainer/run.py`` and
``reward-server``): each ends with exit code 2 and ONE line on stderr that says what is wrong
and how to fix it (no traceback, no usage dump), and leaves no run folder behind; the trainer
started without a server gives up within 15 s (its start-up probe's own 10 s deadline).

A fake server with a bearer token (``reward-server serve --fake``) is up for the mistakes that
need one (a wrong token; a verl run whose data is missing, found once the server answered).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(ROOT / "trainer" / "run.py")]
CLI = [sys.executable, "-m", "reward_server"]
TOKEN = "s3cret"


def env(**extra: str) -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    out.update(PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", **extra)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """``host:port`` of ``reward-server serve --fake`` with a bearer token."""
    proc = subprocess.Popen([*CLI, "serve", "--fake", "--port", "0", "--set",
                             f"server.auth_token={TOKEN}"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env())
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # bounded by the test timeout
            m = re.match(r"listening on (\S+):(\d+)", line)
            if m:
                yield f"127.0.0.1:{m.group(2)}"
                break
        else:
            pytest.fail(f"the server did not start (exit {proc.wait()})")
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """data/ (prepared TRL data), not.parquet (text), a_file, runs/r1 (an existing run)."""
    tmp = tmp_path_factory.mktemp("mistakes")
    subprocess.run([sys.executable, "-m", "trainer.data.prepare", "--sample", "--task",
                    "personalized_generator", "--format", "trl", "--val-size", "1", "--out",
                    str(tmp / "data")], check=True, env=env(), capture_output=True, timeout=120)
    (tmp / "not.parquet").write_text("this is not parquet\n")
    (tmp / "a_file").write_text("x\n")
    (tmp / "items.jsonl").write_text('{"id": "a", "rubric_score": {"context": "c", "text": "t", '
                                     '"rules": ["r"]}}\n')
    (tmp / "camel.jsonl").write_text('{"id": "a", "parl_reward": {"policy_outptu": "x"}}\n')
    (tmp / "typo.yaml").write_text("engines:\n  judge: {kind: transformers, model: x, devcie: cpu}\n")
    (tmp / "token").write_text("wrong\n")
    (tmp / "token").chmod(0o600)  # one readable by others gets a warning line of its own
    return tmp


@dataclass(frozen=True)
class Mistake:
    name: str
    argv: list[str]
    says: str  # a piece of the one line
    output_dir: str = "runs"  # what must stay absent (or as it was) under the work folder
    env: tuple[tuple[str, str], ...] = ()


def mistakes(work: Path, live: str) -> list[Mistake]:
    data, runs, dead = str(work / "data"), str(work / "runs"), f"127.0.0.1:{free_port()}"
    trl = [*RUN, "--engine", "trl", "--output-dir", runs, "--probe-timeout-s", "2"]
    return [
        Mistake("trl without --data", [*trl, "--reward-server", dead], "needs --data"),
        Mistake("trl --data that does not exist", [*trl, "--reward-server", dead, "--data",
                                                   str(work / "nope")], "no such file"),
        Mistake("trl --data that is not parquet", [*trl, "--reward-server", dead, "--data",
                                                   str(work / "not.parquet")], "not a parquet file"),
        Mistake("trl --model folder that does not exist", [*trl, "--reward-server", dead, "--data",
                                                           data, "--model", "./no/such/model"],
                "no such folder"),
        Mistake("trl --output-dir that is a file", [*RUN, "--engine", "trl", "--data", data,
                                                    "--reward-server", dead, "--output-dir",
                                                    str(work / "a_file" / "runs")], "is a file"),
        Mistake("unknown engine", [*RUN, "--engine", "jax"], "invalid choice: 'jax'"),
        Mistake("trl run name that exists", [*trl, "--reward-server", dead, "--data", data,
                                             "--run-name", "r1"], "runs never overwrite"),
        Mistake("trl --report-to unknown", [*trl, "--reward-server", dead, "--data", data,
                                            "--report-to", "mlflow"], "--report-to: unknown"),
        Mistake("trl --reward-server as a URL", [*trl, "--data", data, "--reward-server",
                                                 "http://127.0.0.1:50051"], "is a URL"),
        Mistake("trl --num-generations 1", [*trl, "--reward-server", dead, "--data", data,
                                            "--num-generations", "1"], "--num-generations must be >= 2"),
        Mistake("trl with no server (short probe)", [*trl, "--reward-server", dead, "--data", data],
                f"reward server {dead} is not reachable"),
        Mistake("verl data file that does not exist", [
            *RUN, "--engine", "verl", "--reward-server", live, "--output-dir", runs,
            f"data.train_files={work / 'nope.parquet'}"], "data.train_files",
                env=(("REWARD_SERVER_TOKEN", TOKEN),)),
        Mistake("check-config unknown field", [*CLI, "check-config", "--set", "server.prot=1"],
                "did you mean server.port"),
        Mistake("check-config file that does not exist", [*CLI, "check-config", "-c",
                                                          str(work / "nope.yaml")], "does not exist"),
        Mistake("serve --port not a number", [*CLI, "serve", "--port", "abc"], "invalid int value"),
        # --fake replaces the engines, not a misspelt key: refused, on --set and in the file
        Mistake("serve --fake with a misspelt engines key", [*CLI, "serve", "--fake", "--set",
                                                            "engines.judge.modle=x"],
                "engines.judge.modle (from --set engines.judge.modle=x): unknown key"),
        Mistake("serve --fake, a misspelt engines key in the file", [
            *CLI, "serve", "--fake", "-c", str(work / "typo.yaml")], "engines.judge.devcie"),
        Mistake("score with a token file holding a wrong token", [
            *CLI, "score", "--target", live, "-i", str(work / "items.jsonl")],
                "(UNAUTHENTICATED: wrong bearer token)",  # the file was read
                env=(("REWARD_SERVER_TOKEN_FILE", str(work / "token")),)),
        Mistake("trl with a token file that does not exist", [
            *trl, "--reward-server", live, "--data", data],
                "$REWARD_SERVER_TOKEN_FILE=/no/such/token: no such file",
                env=(("REWARD_SERVER_TOKEN_FILE", "/no/such/token"),)),
        Mistake("info with no server", [*CLI, "info", "--target", dead, "--probe-timeout-s", "1"],
                f"reward server {dead} is not reachable"),
        Mistake("score with a wrong token", [*CLI, "score", "--target", live, "--token", "wrong",
                                             "-i", str(work / "items.jsonl")],
                "server.auth_token"),
        Mistake("score input that does not exist", [*CLI, "score", "-i", str(work / "nope.jsonl")],
                "No such file"),
        Mistake("score input with a misspelt field", [*CLI, "score", "-i", str(work / "camel.jsonl")],
                "policy_output"),  # the fields by their proto (docs) names, not policyOutput
        Mistake("eval nli input that does not exist", [*CLI, "eval", "nli", "--fake", "--input",
                                                       str(work / "nope.jsonl"), "--out",
                                                       str(work / "eval_out")], "nope.jsonl",
                output_dir="eval_out"),
    ]


def run(argv: list[str], timeout: float, **extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(**extra), timeout=timeout,
                          cwd=ROOT, check=False)
    return proc, time.monotonic() - start


def assert_one_line(proc: subprocess.CompletedProcess[str], says: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and says in lines[0], lines[0]


def test_every_mistake_is_one_line_and_exit_2_and_leaves_no_run_folder(
    work: Path, server: str,
) -> None:
    (work / "runs" / "r1").mkdir(parents=True, exist_ok=True)  # an existing run
    made = mistakes(work, server)
    # four at a time (each is a Python start-up, some a 1-2 s probe): a run folder any of them
    # left behind is still there when all have ended
    with ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda m: run(m.argv, timeout=180, **dict(m.env))[0], made))
    seen = []
    for m, proc in zip(made, procs, strict=True):
        assert_one_line(proc, m.says)
        if m.output_dir != "runs":
            assert not (work / m.output_dir).exists(), m.name
        seen.append(f"{m.name}: {proc.stderr.strip()}")
    # only the existing run, nothing new
    assert sorted(p.name for p in (work / "runs").iterdir()) == ["r1"]
    assert len(seen) >= 10
    print("\n".join(seen))  # the messages, for the record (pytest -s)


def test_the_trainer_with_no_server_fails_within_15_s(work: Path, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    proc, took = run([*RUN, "--engine", "trl", "--data", str(work / "data"), "--reward-server",
                      dead, "--output-dir", str(tmp_path / "runs")], timeout=60)
    assert_one_line(proc, f"reward server {dead} is not reachable (UNAVAILABLE: Connection refused)")
    assert "--reward-server HOST:PORT" in proc.stderr  # the fix
    assert not (tmp_path / "runs").exists()
    assert took <= 15.0, took
