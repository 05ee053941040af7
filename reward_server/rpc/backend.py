"""What a servicer's calls run on: a :class:`Backend`.

:class:`~reward_server.rpc.servicer.RewardServicer` is the one servicer of both doors (the gate,
the drain, admission, deadlines, metrics, the status table); its backend does each method's work:

- :class:`LocalBackend`: the reward service in this process (parsing, validation, scoring);
- :class:`~reward_server.rpc.forwarding.ForwardBackend`: the service replicas of
  ``serving.ray.layout: service``, each call's bytes forwarded to one of them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import Message

from reward_server import domain as d
from reward_server import metrics, tracing
from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.api import convert, score_call, wire
from reward_server.rpc.settings import ServerSettings
from reward_server.service import Admission, RewardService, Ticket

RESPONSES: dict[str, type[Message]] = {
    "Score": pb.ScoreResponse, "InduceRubrics": pb.InduceRubricsResponse,
    "Verify": pb.VerifyResponse, "Info": pb.InfoResponse,
}
_FIELD_OVERHEAD = 8  # tag and length of one encoded field, generously


class Reply(Protocol):
    """A method's answer: a response message, or its bytes as a service replica sent them."""

    def SerializeToString(self) -> bytes: ...

    def ByteSize(self) -> int: ...


@dataclass(frozen=True, slots=True)
class CallState:
    """What a method's work may need of its call besides the request."""

    span: Any  # the call's tracing span
    deadline: float  # the event loop's time when the call's deadline passes
    attempts: int  # the client's previous attempts of this call
    time_remaining: Callable[[], float | None]  # the transport's own count (None: it has none)

    def time_left(self) -> float:
        """Seconds left of the call's deadline now: the transport's own count (gRPC's
        ``time_remaining``) read now, never past the deadline the call runs under."""
        left = self.deadline - asyncio.get_running_loop().time()
        own = self.time_remaining()
        return max(0.0, left if own is None else min(own, left))


class Backend(Protocol):
    """The work of the four methods, and what gates and bounds their calls."""

    @property
    def admission(self) -> Admission:
        """Gates every call (the service's, or a forwarding ingress's own)."""

    @property
    def max_request_bytes(self) -> Mapping[str, int]:
        """Per method: no valid request is larger (refused before its work)."""

    @property
    def judged(self) -> Mapping[str, bool]:
        """Per method: whether admission counts its calls' judgments here."""

    def run(self, rpc: str, raw: bytes, ticket: Ticket, call: CallState) -> Awaitable[Reply]:
        """Method ``rpc``'s answer to the request bytes ``raw``; raises what went wrong."""

    def as_message(self, rpc: str, reply: Reply) -> Message:
        """``reply`` of method ``rpc`` as its response message (the HTTP door's JSON)."""


Work = Callable[[bytes, Ticket, CallState], Awaitable[Reply]]


class LocalBackend:
    """The four methods over a :class:`RewardService` in this process; ``settings``: the
    transport's, which Info reports beside the service's."""

    def __init__(self, service: RewardService, settings: ServerSettings) -> None:
        self.service = service
        self._settings = settings
        self.max_request_bytes: Mapping[str, int] = {  # no valid request of the method is larger
            "Score": settings.max_message_bytes,
            **service.largest_request_bytes(_FIELD_OVERHEAD),  # InduceRubrics, Verify
            "Info": 1024,
        }
        self.judged: Mapping[str, bool] = {
            "Score": True, "InduceRubrics": True, "Verify": True,
            "Info": False,  # admitted as a call, with no judgments
        }
        self._work: dict[str, Work] = {
            "Score": self._score, "InduceRubrics": self._induce, "Verify": self._verify,
            "Info": self._info,
        }
        self._info_reply: pb.InfoResponse | None = None

    @property
    def admission(self) -> Admission:
        return self.service.admission

    def run(self, rpc: str, raw: bytes, ticket: Ticket, call: CallState) -> Awaitable[Reply]:
        return self._work[rpc](raw, ticket, call)

    def as_message(self, rpc: str, reply: Reply) -> Message:
        assert isinstance(reply, Message)  # this backend answers messages
        return reply

    async def _score(self, raw: bytes, ticket: Ticket, call: CallState) -> pb.ScoreResponse:
        check = self.service.batch_check()  # refuses at the first bad item
        items = await score_call.score_items(raw, check)
        batch = check.done(items)
        tracing.set_attribute(call.span, "items", len(items))
        try:
            results = await self.service.score(batch, ticket=ticket)
        except Exception:
            for kind, n in collections.Counter(d.kind_of(i.spec).value for i in items).items():
                metrics.observe_failed_items(kind, n)
            raise
        for item, result in zip(items, results, strict=True):
            metrics.observe_item(d.kind_of(item.spec).value, result.status.value, result.reward)
        return await score_call.score_response(results)

    async def _induce(self, raw: bytes, ticket: Ticket, call: CallState) -> pb.InduceRubricsResponse:
        request = wire.parse(pb.InduceRubricsRequest, raw)
        result = await self.service.induce_rubrics(
            convert.history_from_proto(request.history),
            task=convert.task_from_proto(request.task, "request"),
            num_samples=request.num_samples,
            seed=request.seed,
            ticket=ticket,
        )
        return convert.induction_to_proto(result)

    async def _verify(self, raw: bytes, ticket: Ticket, call: CallState) -> pb.VerifyResponse:
        request = wire.parse(pb.VerifyRequest, raw)
        v = await self.service.verify(
            response=request.response,
            answer=request.answer,
            preference=request.preference,
            evidence=request.evidence,
            ticket=ticket,
        )
        return convert.verification_to_proto(v)

    async def _info(self, raw: bytes, ticket: Ticket, call: CallState) -> pb.InfoResponse:
        wire.parse(pb.InfoRequest, raw)
        if self._info_reply is None:  # it does not change while the server runs: build it once
            reply = convert.info_to_proto(self.service.info())  # (64 callers building it
            reply.settings.update(self.transport_info())        # cut Score throughput 61 %)
            self._info_reply = reply
        return self._info_reply

    def transport_info(self) -> dict[str, str]:
        """The transport's limits, for Info."""
        s = self._settings
        names = ("max_message_bytes", "max_concurrent_rpcs", "default_timeout_s",
                 "receive_timeout_s", "max_concurrent_streams", "max_connections",
                 "grace_period_s", "drain_delay_s", "max_unsent_response_bytes",
                 "max_unsent_response_bytes_per_connection", "health_port")
        out = {f"server.{n}": str(getattr(s, n)) for n in names}
        out["server.http.port"] = str(s.http.port)  # the configured one (0: a free one)
        return out
