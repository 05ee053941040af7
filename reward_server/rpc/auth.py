"""Bearer-token authentication (constant-time compare): :class:`TokenCheck`, used by every
reward.v1 gRPC handler (:func:`reward_server.rpc.grpc_metrics.register`; grpc.health.v1 and
reflection are open, for probes and tooling) and by the HTTP/JSON door.

It runs when a call's headers arrive, before its request message: a refused call is answered
UNAUTHENTICATED at once, without waiting for (or reading) a body, so unauthenticated calls hold
nothing, half-open ones included.
"""

from __future__ import annotations

import base64
import binascii
import hmac


class TokenCheck:
    """Whether an ``authorization`` value carries the token: ``Bearer <token>``, or (HTTP
    only, for clients such as OpenRLHF's that can put credentials only in the URL,
    ``http://user:<token>@host``) ``Basic`` with the token as the password."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("auth token must not be empty")
        self._token = token.encode()
        self._expected = b"Bearer " + self._token

    def problem(self, presented: bytes, *, basic: bool = False) -> str | None:
        """None when ``presented`` carries the token; else what is wrong with it."""
        if not presented:
            return "missing authorization metadata; send 'authorization: Bearer <token>'"
        if basic and presented[:6].lower() == b"basic ":
            try:
                _, _, password = base64.b64decode(presented[6:].strip(), validate=True).partition(b":")
            except (binascii.Error, ValueError):
                password = b""
            if hmac.compare_digest(password, self._token):
                return None
        elif hmac.compare_digest(presented, self._expected):
            return None
        return "wrong bearer token"
