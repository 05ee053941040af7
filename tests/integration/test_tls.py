"""TLS: a self-signed certificate made at test time (openssl), server and client both real."""

from __future__ import annotations

import shutil
import subprocess

import grpc
import pytest

from reward_server import domain as d
from reward_server.client import AsyncRewardClient, RewardCallError

from .conftest import running_server

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


async def test_tls_round_trip_and_plaintext_refused(tmp_path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )
    item = d.ScoreItem("a", d.NliConstraintsSpec(response="Paris is big.", answer="Paris", preference="big"))
    async with running_server([f"server.tls_cert_file={cert}", f"server.tls_key_file={key}"]) as r:
        async with AsyncRewardClient(r.target, tls_root_cert=cert.read_bytes()) as c:
            assert (await c.score([item]))[0].status is d.ItemStatus.OK
        async with AsyncRewardClient(r.target, max_retries=0, timeout_s=2) as plain:
            with pytest.raises(RewardCallError) as e:
                await plain.info()
            assert e.value.code is grpc.StatusCode.UNAVAILABLE


async def test_half_configured_tls_is_a_config_error(tmp_path) -> None:  # grpc.aio needs a loop
    from reward_server.backends.fake import FakeJudge, FakeNLI
    from reward_server.config import load_config
    from reward_server.errors import ConfigError
    from reward_server.rpc.backend import LocalBackend
    from reward_server.rpc.server import create_server
    from reward_server.service import RewardService

    config = load_config(overrides=["server.port=0", f"server.tls_cert_file={tmp_path}/c.pem"], env={})
    with pytest.raises(ConfigError, match="must be set together"):
        create_server(config.server,
                      LocalBackend(RewardService(judge=FakeJudge(), nli=FakeNLI()), config.server))
