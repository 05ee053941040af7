"""The training-row contract: what a prepared row carries for its reward, for every trainer.

A row's ``extra_info`` (verl parquet column ``extra_info``; TRL parquet column
``extra_info_json``, the same dict as JSON text) is::

    {"score_item": "<reward.v1.ScoreItem as proto3 JSON text, its response left empty>",
     "user_id": "u1", "index": 0}

``score_item`` is the item's *template*: everything the reward needs but the rollout, in the
JSON convention of :mod:`reward_server.api.jsonmap` (protobuf's ``json_format``, proto field
names). OpenRLHF's ``label`` column is the same text (:mod:`reward_server.rpc.openrlhf`). The
reward kind is the ScoreItem's own ``kind`` oneof; no other key names it.

:func:`extra_info` writes a row (``python -m trainer.data.prepare`` writes every row through
it); :func:`read_row` reads one back and :func:`fill_response` puts one rollout into the
template's response field (each kind's ``response_field`` in :data:`reward_server.api.kinds.FACTS`:
``rubric_score.text``, ``parl_reward.policy_output``, ``nli_constraints.response``; every part
of a weighted item), giving the ScoreItem to send.
The TRL and verl reward functions and the OpenRLHF route all use these.

Rows in the format before this one (keys ``kind``, ``history``, ``rules``, ... and no
``score_item``) are refused with a message that says to re-run the prepare command: a prepared
file is derived from the raw data by one fast, deterministic command, and reading both formats
would keep a second contract alive.

Also the fixed components a row's item reports, which every trainer logs
(:attr:`Row.component_names`, read from the template's own shape by
:func:`reward_server.api.kinds.component_names`: a weighted row logs its own parts' components):
verl builds its per-sample metric arrays from the FIRST result's keys, so every result of a run
must carry the same keys. A component the server did not compute (e.g. after a policy-invalid
output) is 0.0 with its ``<name>_mask`` 0.0 (:func:`reward_server.components.with_masks`),
never NaN.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import jsonmap, kinds
from reward_server.api.convert import item_from_proto, item_to_proto
from reward_server.domain import ItemSpec, RewardKind, ScoreItem
from reward_server.errors import InvalidRequest

TEMPLATE_KEY = "score_item"
PREPARE = "python -m trainer.data.prepare"
_OLD_KEYS = ("kind", "history", "rules", "answer")


class ExtraInfoError(InvalidRequest, ValueError):
    """extra_info (or an OpenRLHF label) is not a row of this contract: the data was not prepared
    by trainer.data.prepare, or by an older version of it. An InvalidRequest, so the server's
    OpenRLHF route answers it as one."""


def check_template(item: pb.ScoreItem, where: str) -> None:
    """ExtraInfoError naming ``where`` unless ``item`` sets a reward kind in each leaf."""
    found = kinds.leaves(item)
    if not found or any(facts is None or not facts.leaf for _, facts in found):
        raise ExtraInfoError(f"{where}: the ScoreItem sets no reward kind (one of "
                             f"{', '.join(f.proto_field for f in kinds.FACTS.values())})")


def fill_response(template: pb.ScoreItem, response: str, *, where: str) -> pb.ScoreItem:
    """A copy of ``template`` with ``response`` in every leaf's response field. A template whose
    response field is already set is refused (ValueError naming ``where``)."""
    item = pb.ScoreItem()
    item.CopyFrom(template)
    for msg, facts in kinds.leaves(item):
        if facts is None or facts.response_field is None:
            raise ExtraInfoError(f"{where}: a leaf sets no reward kind (one of "
                                 f"{', '.join(kinds.LEAF_FIELDS)})")
        name = facts.response_field
        leaf = getattr(msg, facts.proto_field)
        if getattr(leaf, name):
            raise ExtraInfoError(f"{where}: the template's {facts.proto_field}.{name} is set; "
                                 "leave it out, the response is filled in from the rollout")
        setattr(leaf, name, response)
    return item


def template_json(spec: ItemSpec, *, item_id: str) -> str:
    """The template of ``spec`` (its response fields empty) as proto3 JSON text."""
    msg = item_to_proto(ScoreItem(item_id=item_id, spec=spec))
    fill_response(msg, "", where=f"the template of {item_id!r}")  # refuses a set response
    return json.dumps(jsonmap.to_dict(msg), ensure_ascii=False)


def extra_info(spec: ItemSpec, *, user_id: str, index: int) -> dict[str, Any]:
    """One row's ``extra_info``: the template of ``spec`` (response fields empty), the user, the
    row's index. The one writer of the contract."""
    return {TEMPLATE_KEY: template_json(spec, item_id=user_id), "user_id": user_id,
            "index": int(index)}


@dataclass(frozen=True)
class Row:
    """A row's ``extra_info``, read: the ScoreItem template, the user and the index."""

    template: pb.ScoreItem
    user_id: str
    index: int

    @property
    def kind(self) -> RewardKind:
        """The reward kind: the template's oneof case (:func:`read_row` checked it is set)."""
        return RewardKind(self.template.WhichOneof("kind"))

    @property
    def component_names(self) -> tuple[str, ...]:
        """The fixed components the row's item reports: what a trainer logs for it."""
        return kinds.component_names(self.template)

    def item(self, response: str, *, item_id: str) -> ScoreItem:
        """The item to score: the template with ``response`` filled in, called ``item_id``."""
        msg = fill_response(self.template, response, where=f"extra_info of user {self.user_id!r}")
        msg.id = item_id
        return item_from_proto(msg, self.index)


def read_row(extra: Mapping[str, Any] | str, *, where: str = "extra_info") -> Row:
    """``extra`` (a dict, or its JSON text as in TRL's column) as a :class:`Row`;
    :class:`ExtraInfoError` saying what to do when it is not one."""
    if isinstance(extra, str):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as e:
            raise ExtraInfoError(f"{where} is not JSON ({e.msg}); prepare the data with "
                                 f"`{PREPARE}`") from None
    if not isinstance(extra, Mapping):
        raise ExtraInfoError(f"{where} is not a JSON object; prepare the data with `{PREPARE}`")
    text = extra.get(TEMPLATE_KEY)
    if not isinstance(text, str):
        old = [k for k in _OLD_KEYS if k in extra]
        if old:
            raise ExtraInfoError(
                f"{where} is a row of the old format (keys {old}, no {TEMPLATE_KEY!r}): re-run "
                f"`{PREPARE}` with the same arguments to write it in the current one (one "
                "ScoreItem template per row, read alike by verl, TRL and OpenRLHF)")
        raise ExtraInfoError(f"{where} has no {TEMPLATE_KEY!r} (keys {sorted(extra)}); prepare "
                             f"the data with `{PREPARE}`")
    try:
        template = json_format.Parse(text, pb.ScoreItem())
    except (json_format.ParseError, ValueError) as e:
        raise ExtraInfoError(f"{where}.{TEMPLATE_KEY} is not a reward.v1.ScoreItem ({e}); "
                             f"prepare the data with `{PREPARE}`") from None
    check_template(template, f"{where}.{TEMPLATE_KEY}")
    return Row(template=template, user_id=str(extra.get("user_id") or template.id),
               index=int(extra.get("index") or 0))
