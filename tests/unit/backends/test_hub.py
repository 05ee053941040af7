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

    def do_HEAD(self) -> None:  # noqa: N802  (http.server's name)
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


def test_a_cached_model_is_not_probed(hub: _Hub, tmp_path: Path) -> None:
    (tmp_path / "models--some-org--judge-that-is-not-here" / "snapshots" / "abc").mkdir(parents=True)
    for offline in (False, True):
        proc = _check(MODEL, cache=tmp_path, endpoint=_url(hub), offline=offline)
        assert proc.returncode == 0, proc.stderr
    assert hub.requests == 0


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
