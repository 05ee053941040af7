"""The reward-server CLI as a user runs it: a real `serve` process, then the client verbs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "reward_server"]


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def served() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*CLI, "serve", "--fake", "--port", "0", "--set", "server.drain_delay_s=0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"listening on ([\d.]+):(\d+)", line)
    assert m, f"no listening line: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
    yield proc, f"{m.group(1)}:{m.group(2)}"
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_serve_runs_with_glibc_thread_cache_off(served) -> None:
    """server.malloc_tcache_count (0 by default) is in force: `serve` started itself again,
    same process, with the tunable glibc reads at start."""
    proc, _ = served
    from reward_server.rpc.memory import _is_glibc

    if not _is_glibc():
        pytest.skip("not glibc")
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    assert b"GLIBC_TUNABLES=glibc.malloc.tcache_count=0" in environ


def test_health_info_score(served, tmp_path) -> None:
    _, target = served
    assert run_cli("health", "--target", target).stdout.strip() == "SERVING"
    info = json.loads(run_cli("info", "--target", target).stdout)
    assert info["api_version"] == "reward.v1" and info["judge_model"] == "fake-judge"
    items = tmp_path / "items.jsonl"
    items.write_text(
        json.dumps({"id": "a", "nli_constraints": {"response": "Paris is big.", "answer": "Paris",
                                                   "preference": "big"}}) + "\n\n"
        + json.dumps({"id": "b", "rubricScore": {"text": "coffee", "rules": ['Mentions "coffee".']}})
        + "\n"
    )
    out = run_cli("score", "--target", target, "--input", str(items))
    assert out.returncode == 0, out.stderr
    results = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["id"] for r in results] == ["a", "b"]
    assert results[0]["status"] == "ITEM_STATUS_OK" and results[0]["reward"] == 1.0
    assert results[1]["reward"] == pytest.approx(0.98)
    # one JSON convention (reward_server.api.jsonmap): proto field names, defaults printed
    assert "timings_ms" in results[0] and results[0]["message"] == ""
    v = json.loads(run_cli("verify", "--target", target, "--response", "Paris is big.",
                           "--answer", "Paris", "--preference", "big").stdout)
    assert {"s_correct", "s_aligned", "regime", "truncated"} <= set(v)


def test_score_bad_lines_name_the_line(served, tmp_path) -> None:
    _, target = served
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "nli_constraints": {"response": "r", "answer": "a", "preference": "p"}}\n'
                   '{"id": "b", "nli_constraints": {"response": 3\n')
    out = run_cli("score", "--target", target, "--input", str(bad))
    assert out.returncode == 2 and f"{bad}:2:" in out.stderr
    semantic = tmp_path / "semantic.jsonl"
    semantic.write_text('{"id": "a", "nli_constraints": {"response": "r", "answer": "a", "preference": "p"}}\n'
                        '{"id": "b", "nli_constraints": {"response": "r", "answer": "", "preference": "p"}}\n')
    out = run_cli("score", "--target", target, "--input", str(semantic))
    assert out.returncode == 2  # INVALID_ARGUMENT: the input is the user's to fix
    assert f"{semantic}:2: INVALID_ARGUMENT" in out.stderr and "answer: must not be empty" in out.stderr


def test_check_config(tmp_path) -> None:
    good = tmp_path / "c.yaml"
    good.write_text("server:\n  port: 6000\n")
    out = run_cli("check-config", "--config", str(good))
    assert out.returncode == 0 and json.loads(out.stdout)["server"]["port"] == 6000
    bad = tmp_path / "bad.yaml"
    bad.write_text("server:\n  prot: 6000\n")
    out = run_cli("check-config", "--config", str(bad))
    assert out.returncode == 2 and "server.prot" in out.stderr and f"{bad}:2" in out.stderr
    assert "did you mean server.port?" in out.stderr


def test_serve_without_an_engine_refuses_fast_with_the_choices() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REWARD_SERVER")}
    start = time.monotonic()
    out = subprocess.run([*CLI, "serve", "--port", "0"], capture_output=True, text=True,
                         timeout=30, env=env)
    elapsed = time.monotonic() - start
    assert out.returncode == 2 and elapsed < 5, (out.returncode, elapsed)
    for choice in ("--fake", "-c deploy/cpu_local.yaml", "deploy/reward_server_config.yaml"):
        assert choice in out.stderr
    assert "listening" not in out.stdout


def test_fake_serve_says_so_loudly(served) -> None:
    _, target = served
    info = json.loads(run_cli("info", "--target", target).stdout)
    assert info["fake_engines"] is True and info["settings"]["engines.fake"] == "true"


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_user_errors_are_one_line_and_debug_shows_the_traceback(served, tmp_path) -> None:
    _, target = served
    out = run_cli("score", "--target", target, "--input", str(tmp_path / "missing.jsonl"))
    assert out.returncode == 2
    assert "missing.jsonl: No such file or directory" in _one_line(out.stderr)
    out = run_cli("score", "--debug", "--target", target, "--input", str(tmp_path / "missing.jsonl"))
    assert out.returncode != 0 and "Traceback" in out.stderr
    port = target.rsplit(":", 1)[1]
    out = run_cli("serve", "--fake", "--port", port)
    assert out.returncode == 2 and f"cannot bind 127.0.0.1:{port}" in _one_line(out.stderr)
    out = run_cli("health", "--target", "127.0.0.1:1", "--timeout", "1")
    assert out.returncode == 1 and "is the server running at 127.0.0.1:1" in _one_line(out.stderr)


def test_an_unreachable_ray_is_one_line_with_the_fix() -> None:
    import socket

    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ("serve", "--fake", "--port", "0", "--address", f"127.0.0.1:{port}",
            "--set", "logging.level=ERROR")
    start = time.monotonic()
    out = run_cli(*args)
    line = _one_line(out.stderr)
    assert out.returncode == 2 and time.monotonic() - start < 30  # not ray.init's minute of retries
    assert line.startswith(f"error: cannot reach the Ray cluster at 127.0.0.1:{port}"), line
    assert "Connection refused" in line and "ray start --head" in line and "RAY_ADDRESS" in line
    out = run_cli(*args, "--debug")
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_score_output_is_written_whole_or_not_at_all(served, tmp_path) -> None:
    _, target = served
    good = '{"id": "a", "nli_constraints": {"response": "r", "answer": "a", "preference": "p"}}\n'
    bad = '{"id": "b", "nli_constraints": {"response": "r", "answer": "", "preference": "p"}}\n'
    src = tmp_path / "items.jsonl"
    src.write_text(good + bad)
    dest = tmp_path / "out" / "results.jsonl"
    out = run_cli("score", "--target", target, "--input", str(src), "--output", str(dest),
                  "--batch-size", "1")
    assert out.returncode == 2 and not dest.exists()  # the first chunk succeeded, still nothing
    assert not list(dest.parent.iterdir())  # and no partial file left behind
    src.write_text("".join(good.replace('"a"', f'"a{i}"', 1) for i in range(3)))
    assert run_cli("score", "--target", target, "--input", str(src), "--output", str(dest),
                   "--batch-size", "2").returncode == 0
    assert len(dest.read_text().splitlines()) == 3


def test_help_shows_defaults() -> None:
    out = run_cli("score", "--help")
    assert "(default: 64)" in out.stdout and "(default: 127.0.0.1:50051)" in out.stdout
    assert "(default: None)" not in out.stdout


def test_config_errors_from_set_suggest_the_key() -> None:
    out = run_cli("check-config", "--set", "nli.model=x")
    assert out.returncode == 2
    assert "nli.model (from --set nli.model=x): unknown key; did you mean engines.nli.model?" in out.stderr


def test_sigterm_drains_and_exits_cleanly(served) -> None:
    proc, target = served
    proc.send_signal(signal.SIGTERM)
    start = time.monotonic()
    assert proc.wait(timeout=30) == 0
    assert time.monotonic() - start < 30
    assert run_cli("health", "--target", target, "--timeout", "2").returncode != 0


def test_serve_with_http_port_answers_json_and_drains_both_doors() -> None:
    import urllib.request

    proc = subprocess.Popen(
        [*CLI, "serve", "--fake", "--port", "0", "--http-port", "0",
         "--set", "server.drain_delay_s=0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert "listening on" in proc.stdout.readline()
        port = None
        for _ in range(50):  # the door logs its address before the listening line
            m = re.search(r"HTTP/JSON door on http://[\d.]+:(\d+)", proc.stderr.readline())
            if m:
                port = int(m.group(1))
                break
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=10) as resp:
            assert resp.status == 200 and json.loads(resp.read())["status"] == "SERVING"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "HTTP/JSON door stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
