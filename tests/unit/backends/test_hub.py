"""A model that cannot be had fails at once, naming the model and the fix
(reward_server/backends/hub.py), against a hub this test runs on loopback: one that closes every
connection (unreachable: the hub's own loader retries each file five times, ~25 s), one that
answers "no such repository" or "gated", one that answers 500 (left to the loader). The check runs
in a subprocess with huggingface_hub's own environment variables (HF_ENDPOINT, HF_HUB_CACHE,
HF_HUB_OFFLINE), read as a user sets them, at import."""

from __future__ import annotations

import http.server
import os
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from reward_server.backends.hub import check_model_source
from reward_server.errors import ModelLoadError

MODEL = "some-org/judge-that-is-not-here"


class _Hub(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    mode = "close"
    requests = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Hub

    def do_HEAD(self) -> None:
        self.server.requests += 1
        if self.server.mode == "close":  # a hub that cannot be reached: no answer at all
            self.close_connection = True
            self.connection.close()
            return
        status, code = {"missing": (401, "RepoNotFound"), "gated": (403, "GatedRepo"),
                        "error": (500, "")}[self.server.mode]
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[_Hub]:
    server = _Hub(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _check(model: str, *, cache: Path, endpoint: str = "http://127.0.0.1:9",
           offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_ENDPOINT=endpoint, HF_HUB_CACHE=str(cache), HF_HUB_ETAG_TIMEOUT="5")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    code = ("import sys\nfrom reward_server.backends.hub import check_model_source\n"
            "from reward_server.errors import ModelLoadError\n"
            "try:\n    check_model_source(sys.argv[1], setting='engines.judge.model')\n"
            "except ModelLoadError as e:\n    print(e, file=sys.stderr); sys.exit(3)\n")
    return subprocess.run([sys.executable, "-c", code, model], env=env, capture_output=True,
                          text=True, timeout=60)


def _url(hub: _Hub) -> str:
    return f"http://127.0.0.1:{hub.server_address[1]}"


def test_an_unreachable_hub_fails_after_one_request_naming_the_model_and_the_fix(
        hub: _Hub, tmp_path: Path) -> None:
    proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub))
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert MODEL in line and "engines.judge.model" in line and "unreachable" in line, line
    assert "HF_HUB_OFFLINE=1" in line and "local model folder" in line and str(tmp_path) in line
    assert hub.requests == 1  # one HEAD, none of the loader's retries


def test_a_refused_hub_fails_the_same_way(tmp_path: Path) -> None:
    proc = _check(MODEL, cache=tmp_path, endpoint="http://127.0.0.1:9")  # discard: refused
    assert proc.returncode == 3 and "unreachable" in proc.stderr, proc.stderr


def test_offline_and_not_cached_fails_without_asking_the_hub(hub: _Hub, tmp_path: Path) -> None:
    proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub), offline=True)
    assert proc.returncode == 3 and "HF_HUB_OFFLINE is set" in proc.stderr and MODEL in proc.stderr
    assert hub.requests == 0


def test_a_cached_model_is_probed_once_online_and_never_offline(hub: _Hub, tmp_path: Path) -> None:
    """Online, one request tells whether the loader may ask the hub for the files the cache
    lacks (tests/integration/test_model_source.py loads the cached copy when it may not)."""
    (tmp_path / "models--some-org--judge-that-is-not-here" / "snapshots" / "abc").mkdir(parents=True)
    for offline, requests in ((True, 0), (False, 1)):
        proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub), offline=offline)
        assert proc.returncode == 0, proc.stderr
        assert hub.requests == requests


def test_the_hubs_retry_lines_are_printed_once(hub: _Hub) -> None:
    """huggingface_hub's own handler and the application's printed each retry line twice."""
    hub.mode = "error"  # 500: huggingface_hub retries
    code = ("import logging, sys\nlogging.basicConfig(level=logging.INFO, stream=sys.stderr)\n"
            "from huggingface_hub.utils import http_backoff\n"
            "from reward_server.backends.hub import one_log_line_per_record\n"
            "if sys.argv[2] == 'fix':\n    one_log_line_per_record()\n"
            "try:\n    http_backoff('HEAD', sys.argv[1], max_retries=1, base_wait_time=0.01)\n"
            "except Exception:\n    pass  # the 500 after the retry\n")
    for how, lines in (("as-is", 2), ("fix", 1)):
        proc = subprocess.run([sys.executable, "-c", code, f"{_url(hub)}/x", how],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr.count("Retrying in") == lines, (how, proc.stderr)
    assert "WARNING:huggingface_hub" in proc.stderr  # through the application's handler


@pytest.mark.parametrize(("mode", "says"), [("missing", "has no model of that name"),
                                            ("gated", "gated model")])
def test_the_hubs_refusals_are_named(hub: _Hub, tmp_path: Path, mode: str, says: str) -> None:
    hub.mode = mode
    proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub))
    assert proc.returncode == 3 and says in proc.stderr and MODEL in proc.stderr, proc.stderr


def test_other_answers_are_left_to_the_loader(hub: _Hub, tmp_path: Path) -> None:
    hub.mode = "error"
    proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub))
    assert proc.returncode == 0, proc.stderr
    assert hub.requests == 1


def test_local_folders_and_bad_names(tmp_path: Path) -> None:
    check_model_source(str(tmp_path), setting="engines.nli.model")  # a folder: nothing asked
    with pytest.raises(ModelLoadError, match="no such folder"):
        check_model_source(str(tmp_path / "missing"), setting="engines.nli.model")
    with pytest.raises(ModelLoadError, match="neither a folder on this machine nor a Hugging Face hub id"):
        check_model_source("bad id!", setting="engines.nli.model")
