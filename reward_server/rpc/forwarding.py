"""The ingress of ``serving.ray.layout: service``: reward.v1 calls forwarded as bytes.

Each replica of the service deployment runs the whole reward service (parsing, validation,
admission, scoring) behind its own :class:`~reward_server.rpc.servicer.RewardServicer` over a
:class:`~reward_server.rpc.backend.LocalBackend`. The ingress is the same servicer over a
:class:`ForwardBackend`, and does what only it can do and nothing more:

- the transport: TLS, the token check, the limits on connections, streams and message sizes,
  health, reflection, metrics per call, and the drain (the same :class:`RewardServicer` gate:
  a draining ingress holds and then refuses new calls, and the calls in flight finish);
- a bound on the request bytes it holds (``service.admission.max_request_bytes_in_flight``);
- one :data:`Forward` per call: the call's method, its request bytes, the time left of its
  deadline (gRPC's own count at the moment of forwarding) and the client's previous attempts go
  to one replica, whose response bytes come back unparsed (the gRPC answer) or are parsed for
  the HTTP/JSON door.

A replica's admission refusal, invalid request or engine failure comes back as our own error
(:func:`reward_server.rpc.status.portable` on the replica's side) and is answered here by the one
status table, with the replica's retry pushback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from google.protobuf.message import Message

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.rpc.backend import RESPONSES, CallState, Reply
from reward_server.rpc.settings import ServerSettings
from reward_server.service import Admission, Ticket

# what Info adds to a replica's settings: where the answer and its limits come from
INFO_SETTINGS = {"serving.ray.layout": "service", "service.admission.scope": "per replica"}


class Forward(Protocol):
    """Runs one call on a service replica: its response bytes, or our error."""

    async def __call__(
        self, rpc: str, raw: bytes, *, timeout_s: float, attempts: int
    ) -> bytes: ...


class RawReply:
    """A response as the replica serialized it."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data

    def ByteSize(self) -> int:
        return len(self.data)


class ForwardBackend:
    """The four methods run on a service replica (:data:`Forward`).

    ``admission``: the ingress's own, bounding what it holds (request bytes, calls); the
    judgments are admitted by each replica, which also checks each method's own bound on the
    request (here only the transport's)."""

    def __init__(self, forward: Forward, settings: ServerSettings, *, admission: Admission) -> None:
        self._forward = forward
        self.admission = admission
        self.max_request_bytes: Mapping[str, int] = dict.fromkeys(RESPONSES, settings.max_message_bytes)
        self.judged: Mapping[str, bool] = dict.fromkeys(RESPONSES, False)

    async def run(self, rpc: str, raw: bytes, ticket: Ticket, call: CallState) -> Reply:
        data = await self._forward(rpc, raw, timeout_s=call.time_left(), attempts=call.attempts)
        if rpc == "Info":  # a replica's Info, saying that its admission limits are one replica's
            info = pb.InfoResponse.FromString(data)
            info.settings.update(INFO_SETTINGS)
            data = info.SerializeToString()
        return RawReply(data)

    def as_message(self, rpc: str, reply: Reply) -> Message:
        return RESPONSES[rpc].FromString(reply.SerializeToString())
