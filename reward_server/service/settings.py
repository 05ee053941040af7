"""The service layer's configuration: request limits, admission control and the penalty of a
malformed policy output (composed into the server's config as ``service``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from reward_server.service.validation import Limits


class AdmissionSettings(BaseModel):
    """How much work the server accepts at once (more is RESOURCE_EXHAUSTED with a retry hint)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="Bound the work in flight by the limits below.")
    adaptive: bool = Field(
        False, description="Size the judgment and call limits from the engines' measured "
        "throughput and target_p99_s, between the floors and the caps below (latency first: "
        "calls past the measured limit wait or are refused while the engines could take "
        "more); false: the caps are the limits."
    )
    target_p99_s: float | None = Field(
        None, gt=0, le=3600, description="Latency admitted calls should keep under load (p99). "
        "None: twice the latency of a call of the usual size admitted alone, as measured."
    )
    max_judgments_in_flight: int | None = Field(
        None, ge=1, description="Cap on the judgments (judge prompts plus NLI pairs) admitted at "
        "once (the limit itself with adaptive false). None: batches_in_flight times the "
        "engines' batching.max_items (summed over the judge and a separate NLI engine, times "
        "their replicas on Ray)."
    )
    min_judgments_in_flight: int | None = Field(
        None, ge=1, description="Floor of the adaptive judgment limit. None: one full batch "
        "of every engine the calls use (batching.max_items, as above): both engines' while the "
        "last 0.5 s's calls used both, one engine's while they used that one only, the sum "
        "before anything is measured."
    )
    batches_in_flight: int = Field(
        64, ge=1, description="With max_judgments_in_flight None: how many full engine batches "
        "of work may be admitted per engine replica."
    )
    max_calls_in_flight: int = Field(
        4096, ge=1, description="Cap on calls (every method, Info included) admitted at once."
    )
    min_calls_in_flight: int = Field(
        16, ge=1, description="Floor of the adaptive call limit."
    )
    max_waiting: int = Field(
        4096, ge=0, description="Calls waiting in line for room at once (before their request "
        "is read: a waiting call holds no admitted work). A call that does not fit waits, most "
        "previous attempts first, then the earliest, while its deadline allows; it is refused "
        "at once (RESOURCE_EXHAUSTED with a retry hint) when the line's predicted wait, from "
        "the measured throughput, would pass its deadline, or when the line is full (then a "
        "call with more previous attempts takes the place of the newest with fewer). 0: no "
        "line, a call that does not fit is refused at once."
    )
    max_wait_s: float | None = Field(
        None, ge=0, description="The longest a call waits in line. None: as long as its "
        "deadline (or server.default_timeout_s) allows, less the time a call takes once "
        "admitted."
    )
    max_request_bytes_in_flight: int = Field(
        512 * 1024 * 1024, ge=1024, description="Request bytes (encoded) held by admitted and "
        "parsing calls at once."
    )


class ServiceSettings(BaseModel):
    """Request limits, admission control and the penalty of a malformed policy output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy_invalid_penalty: float = Field(
        0.0, ge=-1e6, le=1e6, allow_inf_nan=False,
        description="Reward of an item whose policy output is malformed (empty, over-long, "
        "or for PARL an unparsable rubric); the item's status is POLICY_INVALID. PARL's value: 0."
    )
    limits: Limits = Field(default_factory=Limits)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    call_judgments_in_flight: int | None = Field(
        None, ge=1, description="A Score call's items start in order as its earlier items "
        "finish, with at most this many of its judgments in flight (an item with more starts "
        "alone), so a large call's prompts and engine results exist a window at a time. "
        "None: 4 full batches of every engine (their batching.max_items, summed over the judge "
        "and a separate NLI engine, times their replicas on Ray)."
    )
