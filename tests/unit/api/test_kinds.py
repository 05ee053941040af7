"""The table of kind facts (reward_server.api.kinds) names real things: every RewardKind has
facts, each proto, response and parts field exists in reward.v1 with the right shape, and each
counted field is repeated and capped by a real service.limits field."""

from __future__ import annotations

from google.protobuf.descriptor import FieldDescriptor

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api.kinds import FACTS, LEAF_FIELDS, of_message
from reward_server.domain import RewardKind
from reward_server.service import ServiceSettings


def test_every_kind_has_facts_naming_real_fields() -> None:
    assert set(FACTS) == set(RewardKind)
    oneof = pb.ScoreItem.DESCRIPTOR.oneofs_by_name["kind"]
    part_oneof = {f.name for f in pb.WeightedPart.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert {f.proto_field for f in FACTS.values()} == {f.name for f in oneof.fields}
    assert set(LEAF_FIELDS) == part_oneof  # a combination's parts are the leaf kinds
    limits = set(type(ServiceSettings().limits).model_fields)
    for facts in FACTS.values():
        message = pb.ScoreItem.DESCRIPTOR.fields_by_name[facts.proto_field].message_type
        if facts.leaf:
            assert facts.parts is None
            field = message.fields_by_name[facts.response_field]
            assert field.type == FieldDescriptor.TYPE_STRING, facts.kind
        else:
            assert facts.parts is not None
            assert message.fields_by_name[facts.parts].message_type is pb.WeightedPart.DESCRIPTOR
        for counted in facts.counted:
            assert message.fields_by_name[counted.field].is_repeated, counted
            assert counted.limit in limits, counted


def test_of_message_reads_the_oneof() -> None:
    assert of_message(pb.ScoreItem()) is None
    item = pb.ScoreItem(nli_constraints=pb.NliConstraints(answer="a"))
    assert of_message(item) is FACTS[RewardKind.NLI_CONSTRAINTS]
