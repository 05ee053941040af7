"""JudgeEngine / NLIEngine implementations that call Ray Serve deployment handles.

The service layer sees ordinary engines; Ray stays behind this module. Per call:

- calls arrive already cut to the engine's ``batching.max_items`` by the ingress batcher;
- they go over Serve's gRPC path straight to the replica (``serving.ray.transport: grpc``, the
  default; a call the replica's gRPC message limit refuses is resent as an actor call) or as
  Ray actor calls (``actor``);
- Serve's ``BackPressureError`` (the handle's queue is past ``max_queued_requests``) becomes
  :class:`Overloaded` at once, never retried here (the client backs off);
- a replica that dies mid-call (``ActorDiedError`` and kin, or a failed gRPC call to it) is
  retried ``max_retries`` times
  (Serve routes the retry to a live replica), then :class:`BackendUnavailable`; so is a call
  that runs past ``call_timeout_s``;
- an error the engine raised comes back as our own error (not wrapped in Ray's RayTaskError):
  ours as they were, out-of-memory and device failures as :class:`BackendUnavailable`, anything
  else (a bug) as :class:`EngineError` (INTERNAL, not retried);
- a piece answered with the wrong number of results fails (EngineError); results are never
  shifted onto other items.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

import grpc
from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError
from ray.serve._private.router import SharedRouterLongPollClient
from ray.serve.context import _get_global_client
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)
from ray.serve.handle import DeploymentHandle

from reward_server import metrics
from reward_server.backends.base import GenerationRequest, Health, JudgePrompt, NLIPair, NLIScore
from reward_server.backends.settings import BatchingSettings
from reward_server.errors import (
    BackendUnavailable,
    EngineError,
    Overloaded,
    RewardServerError,
    engine_failure,
)
from reward_server.serving.batching import Batcher

logger = logging.getLogger(__name__)

_REPLICA_GONE = (RayActorError, ActorUnavailableError, ReplicaUnavailableError)
_TOKEN_CACHE = 65_536  # token counts kept (LRU) per ingress
_HEALTH_TTL_S = 1.0


# Ray 2.60's Serve status calls are not thread-safe: reading an application's autoscaling
# config registers, pickles and unregisters its policy module in cloudpickle's global set
# (ray.serve.config.AutoscalingPolicy.serialize_policy), so two threads asking at once (the
# judge's and the NLI's health probes) fail with "ValueError: <module
# 'ray.serve.autoscaling_policy'> is not registered for pickle by value"; seen with
# applications deployed by `serve deploy`. Every status call of this process takes this lock.
SERVE_STATUS_LOCK = threading.Lock()


def replica_counts(app: str) -> dict[str, int]:
    """Replicas of one Serve application's deployments by state (a blocking Serve call).

    Read from the controller's instance details as it sends them (the dict behind
    ``serve.status()`` and the dashboard's ``/api/serve/applications/``), not through
    ``serve.status()``: that re-validates the whole dict into pydantic models, which pickles
    each deployment's request-router class by value; measured on Ray 2.60, 44-50 ms of this
    process's CPU per call, holding the GIL (the event loop stalls), against ~2 ms for the
    dict. The health probe asks once per second per application.
    """
    with SERVE_STATUS_LOCK:
        client = _get_global_client(raise_if_no_controller_running=False)
        details = client.get_serve_details() if client is not None else {}
    counts: dict[str, int] = {}
    for dep in (details.get("applications") or {}).get(app, {}).get("deployments", {}).values():
        for replica in dep.get("replicas", ()):
            state = replica["state"]
            key = str(getattr(state, "value", state))  # a ReplicaState (a str enum) or its value
            counts[key] = counts.get(key, 0) + 1
    return counts


class ReplicaHealth:
    """Healthy iff the application has a RUNNING replica (asked off the loop, cached 1 s)."""

    def __init__(self, app: str) -> None:
        self._app = app
        self._cached: tuple[float, Health] | None = None

    async def check(self) -> Health:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < _HEALTH_TTL_S:
            return self._cached[1]
        try:
            counts = await asyncio.to_thread(replica_counts, self._app)
        except Exception as e:
            h = Health(False, f"Serve status of {self._app} unavailable: {type(e).__name__}: {e}")
        else:
            running = counts.get("RUNNING", 0)
            h = Health(running > 0, "" if running else f"{self._app} has no RUNNING replica {counts}")
        self._cached = (now, h)
        return h


def _stop_polls(router: Any) -> None:
    """Stop a Serve AsyncioRouter's long polls: its own client and the one shared by the
    routers of its controller and event loop. Call on the router's event loop, so that no
    poll is being sent while they stop (a poll that is out returns with nothing sent after)."""
    router.long_poll_client.stop()
    SharedRouterLongPollClient.get_or_create(
        router.long_poll_client.host_actor, router._event_loop).long_poll_client.stop()


async def _shut_router(handle: DeploymentHandle[Any], *, stop_polls: bool) -> None:
    """Shut down a handle's router; with ``stop_polls``, stop its long polls too, on the
    router's own event loop (this one, or Serve's router thread: then waiting until they are
    stopped)."""
    await handle.shutdown_async()  # nothing to do for a handle never used for a call
    router = getattr(handle._router, "_asyncio_router", None)  # Serve's router's inner one
    if not stop_polls or router is None:
        return
    if router._event_loop is asyncio.get_running_loop():
        _stop_polls(router)
        return

    async def stop() -> None:
        _stop_polls(router)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stop(), router._event_loop))


class HandleCaller:
    """Calls one method family of one deployment with the policy in the module doc."""

    def __init__(
        self,
        handle: DeploymentHandle[Any],
        *,
        deployment: str,
        app: str,
        timeout_s: float,
        max_retries: int,
        transport: Literal["grpc", "actor"] = "grpc",
    ) -> None:
        self.handle = handle  # startup, status and the resend as an actor call
        self._grpc = transport == "grpc"
        # (loop, the handle engine calls go through, the handle that owns its router)
        self._hot: tuple[asyncio.AbstractEventLoop, DeploymentHandle[Any],
                         DeploymentHandle[Any]] | None = None
        self._deployment = deployment
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self.app = app
        self.health = ReplicaHealth(app)

    async def call(self, method: str, items: Sequence[Any]) -> list[Any]:
        if not items:
            return []
        return await self._call_piece(method, list(items))

    async def _call_piece(self, method: str, piece: list[Any]) -> list[Any]:
        attempt = 0
        while True:
            start = time.monotonic()
            try:
                with metrics.track_in_flight(self._deployment):
                    out = await self._once(method, piece)
            except BackPressureError as e:
                metrics.observe_engine_call(self._deployment, method, "overloaded", 0.0)
                raise Overloaded(
                    f"the {self._deployment} deployment's queue is full ({e}); retry with "
                    f"backoff, or raise serving.ray.{self._deployment}.max_replicas / "
                    "max_queued_requests"
                ) from None
            except (*_REPLICA_GONE, grpc.aio.AioRpcError) as e:
                if attempt < self._max_retries:
                    attempt += 1
                    metrics.observe_engine_call(self._deployment, method, "retried", 0.0)
                    logger.warning(
                        "%s.%s: replica lost mid-call (%s); retrying on another replica "
                        "(%d/%d)", self._deployment, method, type(e).__name__, attempt,
                        self._max_retries,
                    )
                    continue
                metrics.observe_engine_call(self._deployment, method, "unavailable", 0.0)
                over_grpc = isinstance(e, grpc.aio.AioRpcError)
                how = (f"could not be reached over gRPC ({e.code().name}: {e.details()})"
                       if over_grpc else "died")
                check = ("that the ingress reaches the replicas' ports (or set "
                         "serving.ray.transport=actor)" if over_grpc else "the node's memory")
                raise BackendUnavailable(
                    f"the {self._deployment} replica serving {len(piece)} items {how} and "
                    f"{self._max_retries} retries did not find a live one; check the replicas "
                    f"(serve status) and {check}"
                ) from e
            except DeploymentUnavailableError as e:
                metrics.observe_engine_call(self._deployment, method, "unavailable", 0.0)
                raise BackendUnavailable(
                    f"the {self._deployment} deployment failed to deploy: {e.message}"
                ) from e
            except TimeoutError:
                metrics.observe_engine_call(self._deployment, method, "unavailable", 0.0)
                raise BackendUnavailable(
                    f"the {self._deployment} deployment did not answer {len(piece)} items "
                    f"within serving.ray.call_timeout_s={self._timeout_s}s"
                ) from None
            except RayTaskError as e:
                metrics.observe_engine_call(self._deployment, method, "error", 0.0)
                cause = e.cause
                if isinstance(cause, RewardServerError):  # a copy: its fields (the retry
                    raise copy.copy(cause) from e             # pushback) kept, Ray's wrap not
                if isinstance(cause, BaseException):
                    raise engine_failure(cause, f"the {self._deployment} replica") from e
                raise
            metrics.observe_engine_call(
                self._deployment, method, "ok", time.monotonic() - start
            )
            if not isinstance(out, list) or len(out) != len(piece):
                n = len(out) if isinstance(out, list) else type(out).__name__
                raise EngineError(
                    f"the {self._deployment} deployment answered {n} results for "
                    f"{len(piece)} items; refusing to guess which result is whose"
                )
            return out

    def _hot_handle(self) -> DeploymentHandle[Any]:
        """The handle engine calls go through: its own router, run on this event loop.

        Serve's default handle routes on a router thread of its own: every call and every
        answer crosses threads and waits for the GIL while this loop is busy. A handle
        initialized with ``_run_router_in_separate_loop=False`` (what Serve's
        ``RAY_SERVE_THROUGHPUT_OPTIMIZED`` mode does for its own proxies) routes on the caller's
        loop. Measured with ``python bench/microbatch.py`` on 2 CPUs: verl's pattern,
        micro-batched, on Ray about 8 % more items/s (four interleaved runs,
        docs/performance-log.md). Such a router belongs to one loop, so there is one per loop (an
        ingress has one). The ``handle`` given at construction keeps the router thread
        for the blocking calls of start-up and status.
        """
        loop = asyncio.get_running_loop()
        if self._hot is None or self._hot[0] is not loop:
            own: DeploymentHandle[Any] = DeploymentHandle(self.handle.deployment_name,
                                                          self.handle.app_name)
            own._init(_run_router_in_separate_loop=False)
            # by value: calls go over gRPC straight to the replica, not as actor calls
            self._hot = (loop, own.options(_by_reference=False) if self._grpc else own, own)
        return self._hot[1]

    async def close(self, *, ray_stopping: bool) -> None:
        """Shut down the router of :meth:`_hot_handle` (on its own loop, this one).

        ``ray_stopping``: Ray is about to be shut down in this process. Serve's routers poll
        the controller (one long-poll client of their own, and one shared per controller and
        event loop), and nothing stops those polls: left running on a loop that outlives Ray,
        the next poll auto-starts a new local Ray (with its dashboard), logs "Can't find
        actor" tracebacks, or, from the router thread, ends the process ("The core worker has
        already been shutdown"). So then both routers' polls are stopped too: the hot
        handle's on this loop, and the start-up handle's on Serve's router thread.
        """
        hot, self._hot = self._hot, None
        if hot is not None and hot[0] is asyncio.get_running_loop():
            await _shut_router(hot[2], stop_polls=ray_stopping)
        if ray_stopping:
            await _shut_router(self.handle, stop_polls=True)

    async def _once(self, method: str, piece: list[Any]) -> Any:
        try:
            return await self._send_once(self._hot_handle(), method, piece)
        except grpc.aio.AioRpcError as e:
            if not self._grpc or e.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            # over the replica's gRPC message limit (Ray's 4 MiB default): as an actor call
            metrics.observe_engine_call(self._deployment, method, "resent_as_actor", 0.0)
            logger.debug("%s.%s: %d items over gRPC refused (%s); resent as an actor call",
                         self._deployment, method, len(piece), e.details())
            return await self._send_once(self.handle, method, piece)

    async def _send_once(self, handle: DeploymentHandle[Any], method: str, piece: list[Any]) -> Any:
        response = getattr(handle, method).remote(piece)
        try:
            return await asyncio.wait_for(_await(response), self._timeout_s)
        except TimeoutError:
            response.cancel()
            raise


async def _await(response: Any) -> Any:
    return await response


class RayJudge:
    """A :class:`JudgeEngine` whose work runs on the judge deployment's replicas."""

    def __init__(self, caller: HandleCaller, *, model_id: str) -> None:
        self._caller = caller
        self._model_id = model_id

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def handle(self) -> DeploymentHandle[Any]:
        return self._caller.handle

    @property
    def caller(self) -> HandleCaller:
        return self._caller

    async def p_yes(self, prompts: Sequence[JudgePrompt]) -> list[float]:
        return await self._caller.call("p_yes", prompts)

    async def generate(self, requests: Sequence[GenerationRequest]) -> list[str]:
        return await self._caller.call("generate", requests)

    async def health(self) -> Health:
        return await self._caller.health.check()

    async def close(self) -> None:
        """Nothing to free here; the deployment's lifetime belongs to RayHost.shutdown, the
        handle's router to :meth:`HandleCaller.close` (called by it)."""
        return None


class RayNLI:
    """An :class:`NLIEngine` whose work runs on the NLI deployment's replicas.

    ``token_counts`` asks a replica (the tokenizer lives there) and caches each text's count
    (bounded LRU), so repeated texts cost nothing. The texts missing from the cache go through
    a :class:`Batcher` configured by the same ``engines.nli.batching`` block as the entailment
    calls (``max_items`` texts per call, ``wait_ms``): concurrent 1-item Score calls (verl's
    pattern) would otherwise make one Ray call each before their entailment batch.
    """

    def __init__(
        self, caller: HandleCaller, *, model_id: str, max_length: int, batching: BatchingSettings
    ) -> None:
        self._caller = caller
        self._model_id = model_id
        self._max_length = max_length
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._count_batcher: Batcher[str, int] = Batcher(
            self._fetch_counts, max_items=batching.max_items, wait_s=batching.wait_ms / 1000,
            name="nli_token_counts",
        )

    async def _fetch_counts(self, texts: Sequence[str]) -> list[int]:
        unique = list(dict.fromkeys(texts))  # concurrent calls can miss the same text
        counts = dict(zip(unique, await self._caller.call("token_counts", unique), strict=True))
        return [int(counts[t]) for t in texts]

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def handle(self) -> DeploymentHandle[Any]:
        return self._caller.handle

    @property
    def caller(self) -> HandleCaller:
        return self._caller

    async def token_counts(self, texts: Sequence[str]) -> list[int]:
        missing = list(dict.fromkeys(t for t in texts if t not in self._counts))
        if missing:
            counts = await self._count_batcher.submit(missing)
            for text, count in zip(missing, counts, strict=True):
                self._counts[text] = count
            while len(self._counts) > _TOKEN_CACHE:
                self._counts.popitem(last=False)
        out = []
        for t in texts:
            n = self._counts.get(t)
            if n is None:  # evicted by a concurrent call meanwhile: ask again, alone
                (n,) = await self._caller.call("token_counts", [t])
            out.append(int(n))
        return out

    async def entailment(self, pairs: Sequence[NLIPair]) -> list[NLIScore]:
        return await self._caller.call("entailment", pairs)

    async def health(self) -> Health:
        return await self._caller.health.check()

    async def close(self) -> None:
        return None
