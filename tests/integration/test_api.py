"""Every RPC and reward kind through a real server and the real client, on the fake engines."""

from __future__ import annotations

import json
import math

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server._proto.reward.v1 import reward_pb2_grpc as pb_grpc
from reward_server.client import RewardCallError

HISTORY = (
    d.HistoryItem("Article about mornings", "My coffee every morning is sacred."),
    d.HistoryItem("Article about work", "Before work: coffee, then the morning news."),
)
RULES = ['The text mentions "coffee".', 'The text mentions "morning".', 'The text mentions "tea".']
TARGET = d.HistoryItem("Article about weekends", "Weekend morning, slow coffee.")
BASELINES = ("A cup of coffee is nice.", "Weekends are for sleeping in.")


def parl(output: str, variant: d.ParlVariant = d.ParlVariant.PARL_A) -> d.ParlRewardSpec:
    return d.ParlRewardSpec(
        history=HISTORY, policy_output=output, target=TARGET, baselines=BASELINES, variant=variant
    )


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


async def test_score_every_kind(fake_server) -> None:
    rubric = d.RubricScoreSpec(context="c", text="Coffee in the morning.", rules=tuple(RULES))
    nli = d.NliConstraintsSpec(
        response="Paris is the capital. Museums are great.",
        answer="Paris capital",
        preference="museums",
    )
    items = [
        d.ScoreItem("rubric", rubric),
        d.ScoreItem("parl", parl(json.dumps([{"rule": r} for r in RULES]))),
        d.ScoreItem("nli", nli),
        d.ScoreItem("mix", d.WeightedSpec((d.WeightedPart(1.0, rubric), d.WeightedPart(3.0, nli)))),
    ]
    async with fake_server.client() as c:
        results = await c.score(items)
    assert [r.item_id for r in results] == ["rubric", "parl", "nli", "mix"]
    assert all(r.status is d.ItemStatus.OK for r in results)
    by = {r.item_id: r for r in results}
    # FakeJudge: 0.98 if the quoted word is in the text else 0.02 -> mean of (0.98, 0.98, 0.02)
    assert by["rubric"].reward == pytest.approx((0.98 + 0.98 + 0.02) / 3)
    # PARL-A: "tea" fails validation; survivors coffee, morning. S_T = 0.98; baseline 0 has
    # coffee only (0.5), baseline 1 has neither (0.02). C = min(1, 2/2) = 1.
    s_t, s_b = 0.98, (0.5, 0.02)
    gamma = sigmoid(20 * (s_t - s_b[0])) * sigmoid(20 * (s_t - s_b[1]))
    assert by["parl"].reward == pytest.approx(0.1 + 10 * 1.0 * s_t * gamma)
    # FakeNLI: both hypotheses' content words are in the response -> personalization -> 1.0
    assert by["nli"].reward == pytest.approx(1.0)
    assert by["mix"].reward == pytest.approx((by["rubric"].reward + 3 * 1.0) / 4)
    assert by["mix"].components["part1.weight"] == 3.0
    assert all(r.timings_ms["total"] >= 0 for r in results)


async def test_policy_invalid_fails_only_that_item(fake_server) -> None:
    items = [
        d.ScoreItem("good", parl(json.dumps([{"rule": r} for r in RULES]))),
        d.ScoreItem("garbage", parl("I refuse to write JSON")),
        d.ScoreItem("empty", d.RubricScoreSpec(context="c", text="  ", rules=tuple(RULES))),
        d.ScoreItem("long", d.NliConstraintsSpec(response="x" * 2001, answer="a", preference="p")),
    ]
    async with fake_server.client() as c:
        results = await c.score(items)
    status = {r.item_id: r.status for r in results}
    assert status == {
        "good": d.ItemStatus.OK,
        "garbage": d.ItemStatus.POLICY_INVALID,
        "empty": d.ItemStatus.POLICY_INVALID,
        "long": d.ItemStatus.POLICY_INVALID,
    }
    by = {r.item_id: r for r in results}
    assert by["garbage"].reward == 0.0 and by["garbage"].message
    assert "empty" in by["empty"].message
    assert "2001 bytes" in by["long"].message
    assert by["good"].reward is not None and by["good"].reward > 1.0


async def test_induce_verify_info(fake_server) -> None:
    async with fake_server.client() as c:
        ind = await c.induce_rubrics(HISTORY, num_samples=2, seed=0)
        ver = await c.verify(
            response="Paris is the capital. Museums are great.",
            answer="Paris capital",
            preference="museums",
            evidence=True,
        )
        info = await c.info()
    assert len(ind.attempts) == 2
    assert 0 <= ind.best_attempt < 2 and ind.covered
    # FakeJudge writes 'The text uses the word "w".' rules; only words in every history text survive
    for rule in ind.rules:
        word = rule.split('"')[1]
        assert all(word in h.text.lower() for h in HISTORY)
    assert ver.regime is d.Regime.PERSONALIZATION
    assert {e.constraint for e in ver.evidence} == {"correct", "aligned"}
    assert info.api_version == "reward.v1"
    assert (info.judge_model, info.nli_model) == ("fake-judge", "fake-nli")
    assert info.settings["rubric.margin_k"] == "20.0"
    # the limits in force: the fixture's own, the defaults, the admission limit sized from the
    # engines (64 batches of the fakes' 256 + 256 items), and the transport's
    assert info.settings["service.limits.max_batch_items"] == "8"
    assert info.settings["service.limits.max_id_bytes"] == "256"
    assert info.settings["service.admission.max_judgments_in_flight"] == str(64 * 512)
    assert info.settings["server.receive_timeout_s"] == "30.0"
    assert info.settings["server.max_message_bytes"] == str(32 * 1024 * 1024)
    assert info.template_versions
    assert info.fake_engines is True  # the fixture serves the fakes, and Info says so
    parl = {x.name: x.meaning for x in info.components["parl_reward"]}
    assert "s_target" in parl and "gamma" in parl and parl["s_baseline.{i}"]


async def test_reflection_lists_the_service(fake_server) -> None:
    async with grpc.aio.insecure_channel(fake_server.target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = []
        async for reply in call:
            names += [s.name for s in reply.list_services_response.service]
    assert "reward.v1.RewardService" in names
    assert "grpc.health.v1.Health" in names


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
async def test_reflection_serves_both_versions_with_the_protos_comments(fake_server, version) -> None:
    """What `grpcurl describe reward.v1.ScoreItem` reads: the file, with its field comments."""
    from google.protobuf import descriptor_pb2

    path = f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo"
    async with grpc.aio.insecure_channel(fake_server.target) as ch:
        call = ch.stream_stream(
            path,
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )(iter([reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="reward.v1.ScoreItem")]))
        replies = [r async for r in call]
    names = [s.name for s in replies[0].list_services_response.service]
    assert {"reward.v1.RewardService", f"grpc.reflection.{version}.ServerReflection"} <= set(names)
    (raw,) = replies[1].file_descriptor_response.file_descriptor_proto
    file = descriptor_pb2.FileDescriptorProto.FromString(raw)
    assert file.name == "reward/v1/reward.proto"
    message = [m.name for m in file.message_type].index("ScoreItem")
    field_id = [f.name for f in file.message_type[message].field].index("id")
    comments = {tuple(loc.path): loc.leading_comments for loc in file.source_code_info.location}
    assert "unique within the request" in comments[(4, message, 2, field_id)]  # message 4, field 2


async def test_raw_stub_and_health(fake_server) -> None:
    async with grpc.aio.insecure_channel(fake_server.target) as ch:
        reply = await pb_grpc.RewardServiceStub(ch).Info(pb.InfoRequest())
    assert reply.api_version == "reward.v1"
    async with fake_server.client() as c:
        assert await c.health() == "SERVING"
        assert await c.health("reward.v1.RewardService") == "SERVING"


async def test_prometheus_counts_calls_and_items(fake_server) -> None:
    from prometheus_client import REGISTRY

    def value(name: str, labels: dict[str, str]) -> float:
        if name == "reward_server_rpc_calls_total":
            labels = {**labels, "transport": "grpc"}  # the gRPC door's calls
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before_ok = value("reward_server_rpc_calls_total", {"rpc": "Score", "code": "OK"})
    before_bad = value("reward_server_rpc_calls_total", {"rpc": "Score", "code": "INVALID_ARGUMENT"})
    before_items = value("reward_server_items_total", {"kind": "parl_reward", "status": "policy_invalid"})
    async with fake_server.client(max_retries=0) as c:
        await c.score([d.ScoreItem("x", parl("not json"))])
        with pytest.raises(RewardCallError):
            await c.score([])
    assert value("reward_server_rpc_calls_total", {"rpc": "Score", "code": "OK"}) == before_ok + 1
    assert value("reward_server_rpc_calls_total", {"rpc": "Score", "code": "INVALID_ARGUMENT"}) == before_bad + 1
    assert value("reward_server_items_total",
                 {"kind": "parl_reward", "status": "policy_invalid"}) == before_items + 1
