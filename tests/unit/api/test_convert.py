"""proto <-> domain round trips for every message."""

import pytest

from reward_server import domain as d
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert, score_call
from reward_server.errors import InvalidRequest

H = (d.HistoryItem("ctx one", "text one"), d.HistoryItem("", "text two"))
RUBRIC = d.RubricScoreSpec(
    context="c", text="t", rules=("r1", "r2"), task=d.Task.NEWS,
    aggregate=d.RubricAggregate.ALL_SATISFIED,
)
PARL = d.ParlRewardSpec(
    history=H, policy_output='[{"rule": "x"}]', target=d.HistoryItem("tc", "tt"),
    baselines=("b1", "b2"), variant=d.ParlVariant.PARL_B, task=d.Task.AMAZON,
)
NLI = d.NliConstraintsSpec(response="r", answer="a", preference="p",
                           reward_function=d.NliRewardFunction.PRODUCT)
ITEMS = [
    d.ScoreItem("a", RUBRIC),
    d.ScoreItem("b", PARL),
    d.ScoreItem("c", NLI),
    d.ScoreItem("d", d.NliConstraintsSpec(response="r", answer="a", preference="p")),
    d.ScoreItem("e", d.WeightedSpec((d.WeightedPart(0.25, RUBRIC), d.WeightedPart(0.75, NLI)))),
]


@pytest.mark.parametrize("item", ITEMS, ids=lambda i: i.item_id)
def test_score_item_round_trip(item: d.ScoreItem) -> None:
    wire = pb.ScoreItem.FromString(convert.item_to_proto(item).SerializeToString())
    assert convert.item_from_proto(wire, 0) == item


def test_item_result_round_trip() -> None:
    for r in [
        d.ItemResult("x", d.ItemStatus.OK, 0.25, {"s": 1.0}, {"total": 2.0}, ""),
        d.ItemResult("y", d.ItemStatus.POLICY_INVALID, 0.0, {}, {}, "unparsable"),
        d.ItemResult("z", d.ItemStatus.OK, None),
    ]:
        wire = pb.ItemResult.FromString(convert.result_to_proto(r).SerializeToString())
        assert convert.result_from_proto(wire) == r


def test_induction_verification_info_round_trip() -> None:
    ind = d.InductionResult(
        rules=("a rule",), covered=True, best_attempt=1,
        attempts=(d.InductionAttempt("raw", (), (), "not JSON"),
                  d.InductionAttempt("raw2", ("a rule", "b"), ("a rule",), None)),
    )
    assert convert.induction_from_proto(convert.induction_to_proto(ind)) == ind
    ver = d.Verification(
        s_correct=0.9, s_aligned=0.1, regime=d.Regime.GENERALIZATION, truncated=True,
        evidence=(d.ConstraintEvidence("correct", 0.9, ("p1", "p2"), ("h1",), (1,), (0,),
                                       (d.EvidencePair(1, 0),)),),
    )
    assert convert.verification_from_proto(convert.verification_to_proto(ver)) == ver
    info = d.ServerInfo("reward.v1", "0.1.0", "j", "n", {"t": "v1"}, {"k": "1"})
    assert convert.info_from_proto(convert.info_to_proto(info)) == info


def test_structural_errors_name_item_and_field() -> None:
    with pytest.raises(InvalidRequest, match=r"items\[3\] \(id 'q'\): no reward kind set"):
        convert.item_from_proto(pb.ScoreItem(id="q"), 3)
    msg = pb.ScoreItem(id="v", parl_reward=pb.ParlReward(policy_output="x"))
    with pytest.raises(InvalidRequest, match=r"parl_reward.variant: must be set"):
        convert.item_from_proto(msg, 0)
    msg = pb.ScoreItem(id="w", parl_reward=pb.ParlReward(variant=7))
    with pytest.raises(InvalidRequest, match=r"unknown ParlVariant value 7"):
        convert.item_from_proto(msg, 0)
    msg = pb.ScoreItem(weighted=pb.WeightedCombination(parts=[pb.WeightedPart(weight=1.0)]))
    with pytest.raises(InvalidRequest, match=r"items\[0\].weighted.parts\[0\]: no reward kind"):
        convert.item_from_proto(msg, 0)


def test_empty_id_is_numbered() -> None:
    msg = pb.ScoreItem(nli_constraints=pb.NliConstraints(response="r", answer="a", preference="p"))
    assert convert.item_from_proto(msg, 5).item_id == "#5"


async def test_the_items_of_one_request_share_their_rule_strings() -> None:
    """A rubric judged on many texts arrives once per item; the items keep one copy of it."""
    rules = ["Uses short sentences.", "Mentions a place."]
    raw = pb.ScoreRequest(items=[
        pb.ScoreItem(id=f"i{k}", rubric_score=pb.RubricScore(text=f"text {k}", rules=rules)) for k in range(3)
    ]).SerializeToString()
    items = await score_call.score_items(raw, _check())
    first = items[0].spec
    assert isinstance(first, d.RubricScoreSpec) and list(first.rules) == rules
    for item in items[1:]:
        assert isinstance(item.spec, d.RubricScoreSpec)
        assert all(a is b for a, b in zip(item.spec.rules, first.rules, strict=True))


class _AllowAll:
    """A BatchCheck that allows every batch (the limits have their own tests)."""

    max_items = 1024
    max_item_bytes = 1 << 20

    def size(self, n: int) -> None:
        return None

    def item(self, item: d.ScoreItem, index: int) -> None:
        return None

    def entries(self, n: int, name: str, where: str) -> None:
        return None


def _check() -> _AllowAll:
    return _AllowAll()
