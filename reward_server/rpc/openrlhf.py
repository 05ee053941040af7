"""OpenRLHF's remote reward model protocol, over a Score call (the route ``POST /openrlhf/reward``
of the HTTP/JSON door).

OpenRLHF (``--reward.remote_url``; ``--remote_rm_url`` before 0.10.2) POSTs, per generated sample,
``{"query": [q], "prompts": [p], "labels": [l]}``: ``q`` is the prompt and the response decoded
together with ``skip_special_tokens=False``, ``p`` the prompt as the dataset gave it (after the
chat template when ``--data.apply_chat_template``), ``l`` the row's ``--data.label_key`` column.
It reads ``rewards``, ``scores`` and ``extra_logs`` (``{name: [value per sample]}``) from the
answer.

Here:

* ``l`` is a reward.v1.ScoreItem in our JSON convention (:mod:`reward_server.api.jsonmap`)
  without its response: the row's template of the training-row contract
  (:mod:`reward_server.api.rows`; ``python -m trainer.data.prepare --format
  openrlhf`` writes it, as a JSON string; a JSON object works too);
* the response is ``q`` after the prefix ``p`` (matched exactly, or else ignoring differences in
  whitespace, which detokenization may introduce), with the special-token texts of
  ``server.http.openrlhf_end_markers`` (the EOS token) and surrounding whitespace removed from
  its end; the contract's ``fill_response`` puts it into the item's response field
  (``rubric_score.text``, ``parl_reward.policy_output``, ``nli_constraints.response``, in every
  part of a weighted one), as for verl and TRL;
* ``rewards`` and ``scores`` are the items' rewards (a policy-invalid output gets
  ``service.policy_invalid_penalty``, as over gRPC), ``extra_logs`` the fixed components of the
  items (:func:`reward_server.api.kinds.component_names`, as verl and TRL log them), each with
  ``<name>_mask``, plus
  ``policy_invalid`` (0/1). Every value is finite: a component an item did not compute (a
  policy-invalid output) is 0.0 with its mask 0.0 (OpenRLHF 0.11 averages each list with a
  plain ``.mean()``, so a NaN would turn the step's metric NaN; the mean over the samples it
  applies to is ``mean(name) / mean(name_mask)``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from reward_server import components
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import jsonmap, kinds, rows
from reward_server.errors import InvalidRequest
from reward_server.rpc import jsonlimits

KEYS = ("query", "prompts", "labels")


def _after_loose_prefix(query: str, prompt: str) -> str | None:
    """``query`` after ``prompt`` when they agree but for whitespace; else None."""
    qi = 0
    for ch in prompt:
        if ch.isspace():
            continue
        while qi < len(query) and query[qi].isspace():
            qi += 1
        if qi >= len(query) or query[qi] != ch:
            return None
        qi += 1
    return query[qi:]


def response_text(query: str, prompt: str, end_markers: Sequence[str], *, where: str) -> str:
    """The response in ``query`` (see the module doc); InvalidRequest naming ``where`` when
    ``query`` does not start with ``prompt``."""
    rest = query[len(prompt):] if query.startswith(prompt) else _after_loose_prefix(query, prompt)
    if rest is None:
        raise InvalidRequest(
            f"{where}: the query does not start with its prompt, so the response cannot be "
            "found in it (did OpenRLHF truncate the prompt? raise its --data.max_len or lower "
            "--rollout.max_new_tokens)"
        )
    rest = rest.strip()
    trimmed = True
    while trimmed:
        trimmed = False
        for marker in end_markers:
            if marker and rest.endswith(marker):
                rest = rest[: -len(marker)].rstrip()
                trimmed = True
    return rest


def template(label: Any, *, where: str) -> pb.ScoreItem:
    """The ScoreItem template a label carries (see the module doc)."""
    if isinstance(label, str):
        if not label.strip():
            raise InvalidRequest(
                f"{where}: the label is empty; prepare the data with `python -m "
                "trainer.data.prepare --format openrlhf` and pass --data.label_key label"
            )
        jsonlimits.check(label, max_depth=jsonlimits.MAX_DEPTH,
                         max_values=jsonlimits.MAX_VALUES, what=f"{where}: the label")
        try:
            label = json.loads(label, parse_int=jsonlimits.integer)  # no int past 20 digits
        except RecursionError:
            raise InvalidRequest(f"{where}: the label is nested too deeply") from None
        except json.JSONDecodeError as e:
            raise InvalidRequest(
                f"{where}: the label is not JSON ({e.msg} at char {e.pos}); it must be a "
                "reward.v1.ScoreItem without its response, as trainer.data.prepare "
                "--format openrlhf writes it"
            ) from None
    jsonlimits.refuse_booleans(pb.ScoreItem.DESCRIPTOR, label, f"{where}: the label")
    item = jsonmap.parse_dict(pb.ScoreItem, label, f"{where}: the label")
    rows.check_template(item, f"{where}: the label's ScoreItem")
    return item


def score_request(payload: Any, *, end_markers: Sequence[str]) -> pb.ScoreRequest:
    """The Score request of one OpenRLHF request body (decoded JSON)."""
    if not isinstance(payload, dict):
        raise InvalidRequest("the body is not a JSON object with keys query, prompts, labels")
    missing = [k for k in KEYS if not isinstance(payload.get(k), list)]
    if missing:
        raise InvalidRequest(f"the body has no list {missing}; OpenRLHF sends "
                             '{"query": [...], "prompts": [...], "labels": [...]}')
    queries, prompts, labels = (payload[k] for k in KEYS)
    if not len(queries) == len(prompts) == len(labels):
        raise InvalidRequest(f"query, prompts and labels have {len(queries)}, {len(prompts)} "
                             f"and {len(labels)} entries; send one of each per sample")
    request = pb.ScoreRequest()
    for i, (q, p, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        where = f"sample {i}"
        if not isinstance(q, str) or not isinstance(p, str):
            raise InvalidRequest(f"{where}: query and prompt must be strings")
        item = rows.fill_response(template(label, where=where),
                                  response_text(q, p, end_markers, where=where), where=where)
        if not item.id:
            item.id = f"sample{i}"
        request.items.append(item)
    return request


def reply(request: pb.ScoreRequest, response: pb.ScoreResponse) -> dict[str, Any]:
    """OpenRLHF's answer: rewards, scores and extra_logs (see the module doc)."""
    names: list[str] = []
    for item in request.items:
        names += [n for n in kinds.component_names(item) if n not in names]
    rewards = [r.reward for r in response.results]
    per_sample = [components.with_masks(names, r.components) for r in response.results]
    logs: dict[str, list[float]] = {
        key: [sample[key] for sample in per_sample] for key in (per_sample[0] if per_sample else {})
    }
    logs["policy_invalid"] = [
        1.0 if r.status == pb.ITEM_STATUS_POLICY_INVALID else 0.0 for r in response.results
    ]
    return {"rewards": rewards, "scores": list(rewards), "extra_logs": logs}
