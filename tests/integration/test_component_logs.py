"""Every trainer logs the same components for the same row, for every reward kind: one row
(its ScoreItem template, written by the row contract) goes through verl's ``compute_score``,
TRL's reward function and OpenRLHF's route on a real server (fake engines), and each door logs
the row's own components (reward_server.api.kinds.component_names), each one computed (mask 1),
with the same value. The weighted rows include PARL + NLI, whose PARL part verl and TRL once
logged under the rubric score's names (always masked) while OpenRLHF logged PARL's."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from reward_server import domain as d
from reward_server.api.kinds import FACTS
from reward_server.api.rows import extra_info, read_row
from reward_server.components import MASK_SUFFIX
from reward_server.integrations import verl as rverl
from reward_server.integrations.trl import RewardServerReward

from .conftest import Running, running_server

R1, R2 = 'The text uses the word "alpha".', 'The text uses the word "beta".'
RUBRIC = d.RubricScoreSpec("ctx", "", (R1, R2))
PARL = d.ParlRewardSpec((d.HistoryItem("c", "alpha beta"), d.HistoryItem("c", "alpha beta gamma")),
                        "", d.HistoryItem("t", "alpha"), ("beta", "none"), d.ParlVariant.PARL_A)
NLI = d.NliConstraintsSpec("", "Paris", "museums")
TEXT = "alpha beta: Paris has museums"  # satisfies the rubric and both NLI constraints
RULES = json.dumps([{"rule": R1}, {"rule": R2}])  # a valid PARL output (and a text for NLI)


def weighted(*parts: d.LeafSpec) -> d.WeightedSpec:
    return d.WeightedSpec(tuple(d.WeightedPart(1.0, p) for p in parts))


ROWS: dict[str, tuple[d.ItemSpec, str]] = {  # row -> (its spec, a valid rollout for it)
    "rubric_score": (RUBRIC, TEXT),
    "parl_reward": (PARL, RULES),
    "nli_constraints": (NLI, TEXT),
    "weighted rubric_score + nli_constraints": (weighted(RUBRIC, NLI), TEXT),
    "weighted parl_reward + nli_constraints": (weighted(PARL, NLI), RULES),
    "weighted parl_reward + rubric_score": (weighted(PARL, RUBRIC), RULES),
}
PROMPT = "Write it: "
STATUS = {"score", "policy_invalid", "reward_masked", "masked", "wait_s", "score_s"}


@pytest_asyncio.fixture(scope="module")
async def server() -> AsyncIterator[Running]:
    async with running_server(["server.http.port=0"]) as r:
        yield r


async def verl_logs(server: Running, extra: dict[str, Any], rollout: str) -> dict[str, float]:
    out = await rverl.compute_score("src", rollout, None, extra, reward_server=server.target,
                                    probe_timeout_s=5.0)
    await rverl.close_clients()
    return out


async def trl_logs(server: Running, extra: dict[str, Any], rollout: str) -> dict[str, float]:
    logged: dict[str, float] = {}
    reward = RewardServerReward(server.target, probe_timeout_s=5.0)
    await reward([PROMPT], [rollout], extra_info_json=[json.dumps(extra)],
                 log_metric=logged.__setitem__)
    await reward._client_here().close()
    return {k.removeprefix("reward/"): v for k, v in logged.items()}


async def openrlhf_logs(server: Running, extra: dict[str, Any], rollout: str) -> dict[str, float]:
    body = {"query": [PROMPT + rollout], "prompts": [PROMPT], "labels": [extra["score_item"]]}
    url = f"http://127.0.0.1:{server.app.http_port}/openrlhf/reward"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        answer = await resp.json()
    return {k: v[0] for k, v in answer["extra_logs"].items()}


def components(logs: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in logs.items() if k not in STATUS and not k.endswith(MASK_SUFFIX)}


@pytest.mark.parametrize("row", list(ROWS))
async def test_every_door_logs_the_rows_own_components(server: Running, row: str) -> None:
    spec, rollout = ROWS[row]
    extra = extra_info(spec, user_id="u1", index=0)
    names = read_row(extra).component_names
    logs = {"verl": await verl_logs(server, extra, rollout),
            "TRL": await trl_logs(server, extra, rollout),
            "OpenRLHF": await openrlhf_logs(server, extra, rollout)}
    assert logs["verl"]["policy_invalid"] == 0.0 and logs["OpenRLHF"]["policy_invalid"] == 0.0
    for door, got in logs.items():
        assert sorted(components(got)) == sorted(names), door
        if door != "TRL":  # TRL logs only what was computed; the others mask the rest
            assert [n for n in names if got[n + MASK_SUFFIX] != 1.0] == [], f"{door}: masked"
    for name in names:
        values = {door: got[name] for door, got in logs.items()}
        assert all(math.isfinite(v) for v in values.values()), (name, values)
        assert len(set(values.values())) == 1, (name, values)
    if isinstance(spec, d.WeightedSpec):  # each part logs its own kind's components, no other's
        for j, part in enumerate(spec.parts):
            own = {f"part{j}.{n}" for n in FACTS[d.kind_of(part.spec)].fixed_names}
            assert {n for n in names if n.startswith(f"part{j}.")} == own | {
                f"part{j}.reward", f"part{j}.weight"}
