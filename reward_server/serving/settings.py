"""Where the engines run: in the server process, or as Ray Serve deployments."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ServingSettings(BaseModel):
    """Hosting of the judge and NLI engines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["inprocess", "ray"] = Field(
        "inprocess",
        description="inprocess: engines live in the gRPC server's process (tests, laptops); "
        "ray: engines are Ray Serve deployments behind handles.",
    )
    ray_address: str | None = Field(
        None, description="Join this Ray cluster (also RAY_ADDRESS); None starts a local Ray."
    )
