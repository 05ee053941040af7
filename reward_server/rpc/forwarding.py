"""The ingress of ``serving.ray.layout: service``: reward.v1 calls forwarded as bytes.

Each replica of the service deployment runs the whole reward service (parsing, validation,
admission, scoring) behind its own :class:`~reward_server.rpc.servicer.RewardServicer`. The
ingress does what only it can do and nothing more:

- the transport: TLS, the token check, the limits on connections, streams and message sizes,
  health, reflection, metrics per call, and the drain (the same :class:`RewardServicer` gate:
  a draining ingress holds and then refuses new calls, and the calls in flight finish);
- a bound on the request bytes it holds (``service.admission.max_request_bytes_in_flight``);
- one :data:`Forward` per call: the call's method, its request bytes, the time left of its
  deadline and the client's previous attempts go to one replica, whose response bytes come back
  unparsed (the gRPC answer) or are parsed for the HTTP/JSON door.

A replica's admission refusal, invalid request or engine failure comes back as our own error
(:func:`reward_server.rpc.status.portable` on the replica's side) and is answered here by the one
status table, with the replica's retry pushback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf.message import Message

from reward_server._proto.reward.v1 import reward_pb2 as pb
from reward_server.rpc.servicer import RESPONSES, CallState, Reply, RewardServicer, Work
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


class ForwardingServicer(RewardServicer):
    """reward.v1.RewardService whose work runs on a service replica (:data:`Forward`).

    ``admission``: the ingress's own, bounding what it holds (request bytes, calls); the
    judgments are admitted by each replica."""

    def __init__(
        self,
        forward: Forward,
        settings: ServerSettings,
        *,
        admission: Admission,
        on_engine_failure: Callable[[], None] | None = None,
    ) -> None:
        self._forward = forward
        self._setup(settings, admission=admission, on_engine_failure=on_engine_failure)
        # the replica checks each method's own bound; here only the transport's
        self._max_bytes = dict.fromkeys(RESPONSES, settings.max_message_bytes)
        self._work = {rpc: (self._forwarder(rpc), False) for rpc in RESPONSES}
        self._info_from_replica = self._work["Info"][0]
        self._work["Info"] = (self._info_forwarded, False)

    def _forwarder(self, rpc: str) -> Work:
        async def forwarded(raw: bytes, ticket: Ticket, call: CallState) -> Reply:
            left = call.deadline - asyncio.get_running_loop().time()
            return RawReply(await self._forward(rpc, raw, timeout_s=max(0.0, left),
                                                attempts=call.attempts))

        return forwarded

    async def _info_forwarded(self, raw: bytes, ticket: Ticket, call: CallState) -> Reply:
        """A replica's Info, saying that its admission limits are one replica's."""
        reply = await self._info_from_replica(raw, ticket, call)
        info = pb.InfoResponse.FromString(reply.SerializeToString())
        info.settings.update(INFO_SETTINGS)
        return RawReply(info.SerializeToString())

    def _serializer(self, rpc: str) -> Callable[[Any], bytes]:
        serialize: Callable[[Any], bytes] = RawReply.SerializeToString
        return serialize

    def as_message(self, rpc: str, reply: Reply) -> Message:
        return RESPONSES[rpc].FromString(reply.SerializeToString())
