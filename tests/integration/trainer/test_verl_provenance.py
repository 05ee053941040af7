"""The verl path logs the reward server's Info and writes provenance.json at start, before verl
(and Ray) start: an unreachable reward server fails the run in seconds, not after model loading."""

from __future__ import annotations

import json
import logging
import time

import pytest

pytest.importorskip("verl", reason="verl is the train extra: pip install -e .[train]")

from reward_server.client import RewardCallError
from trainer import verl_runner


def test_verl_run_logs_the_servers_info_first(reward_server, tmp_path, caplog) -> None:
    config = verl_runner.compose("rubric_generator", [
        f"reward.custom_reward_function.reward_kwargs.reward_server={reward_server.target}"])
    with caplog.at_level(logging.INFO, logger="trainer.verl_runner"):
        provenance = verl_runner.log_provenance(config, tmp_path)
    assert provenance["judge_model"] == "fake-judge" and provenance["fake_engines"] is True
    assert json.loads((tmp_path / "provenance.json").read_text()) == json.loads(
        json.dumps(provenance, default=str))
    assert any(r.getMessage().startswith("reward provenance: api") for r in caplog.records)


def test_verl_run_stops_before_verl_starts_when_the_server_is_away(tmp_path) -> None:
    start = time.monotonic()
    with pytest.raises(RewardCallError) as e:
        verl_runner.run("rubric_generator", [
            "reward.custom_reward_function.reward_kwargs.reward_server=127.0.0.1:1",
            "reward.custom_reward_function.reward_kwargs.probe_timeout_s=1.5"], run_dir=tmp_path)
    assert e.value.method == "Info" and e.value.code.name == "UNAVAILABLE"
    assert time.monotonic() - start < 20
    assert (tmp_path / "provenance.json").exists() is False
