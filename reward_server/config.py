"""The configuration tree, composed from the settings each layer owns.

================  =======================================  ==========================
section           what                                     owned by
================  =======================================  ==========================
``server``        gRPC bind, auth, TLS, sizes, drain        reward_server.rpc.settings
``service``       request limits, policy-invalid penalty    reward_server.service
``engines``       judge and NLI engine (by ``kind``),       reward_server.backends.settings
                  each with its ``batching`` block
``serving``       in-process or Ray Serve (``ray:``)        reward_server.serving.settings
``rubric``        PARL constants (paper values)            reward_server.rubric.settings
``nli``           NLICV constants and templates            reward_server.nli.settings
``logging``       level, JSON lines                        here
================  =======================================  ==========================

This module imports those settings and nothing imports this module but the top (CLI, the
composition root in :mod:`reward_server.app`). Precedence (later wins): defaults < YAML file
< environment ``REWARD_SERVER__SECTION__FIELD`` < ``--set section.field=value`` overrides.
Values from the environment and overrides are parsed as YAML (``true``, ``3``, ``[a, b]``,
``{kind: fake}``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from reward_server.backends.settings import EnginesSettings
from reward_server.backends.smollm2 import local_smollm2_path as local_smollm2_path  # the trainer's bundled policy
from reward_server.client.auth import bearer_token
from reward_server.config_errors import format_errors, yaml_key_lines
from reward_server.errors import ConfigError as ConfigError  # re-exported: the trainer's face
from reward_server.nli.settings import NLISettings
from reward_server.rpc.settings import ServerSettings
from reward_server.rubric.settings import RubricSettings as RubricSettings  # (also the trainer's)
from reward_server.service import ServiceSettings
from reward_server.serving.settings import ServingSettings

ENV_PREFIX = "REWARD_SERVER__"
TOKEN_ENV = "REWARD_SERVER_TOKEN"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LoggingSettings(_Frozen):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Root level.")
    json_format: bool = Field(False, description="One JSON object per log line.")


class RewardServerConfig(_Frozen):
    """Everything the reward server reads. ``reward-server check-config`` validates a file."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    service: ServiceSettings = Field(default_factory=ServiceSettings)
    engines: EnginesSettings = Field(default_factory=EnginesSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    rubric: RubricSettings = Field(default_factory=RubricSettings)
    nli: NLISettings = Field(default_factory=NLISettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)


def _set_path(
    tree: dict[str, Any],
    dotted: str,
    value: Any,
    *,
    origin: str,
    origins: dict[tuple[str, ...], str],
) -> None:
    keys = [k for k in dotted.split(".") if k]
    if not keys:
        raise ConfigError(f"{origin}: empty key; expected section.field=value")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {key!r} is a value, not a section")
        node = child
    node[keys[-1]] = value
    path = tuple(keys)
    for old in [k for k in origins if k[: len(path)] == path]:
        del origins[old]  # a later layer replaced this key (and everything under it)
    origins[path] = origin


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def load_config(
    path: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> RewardServerConfig:
    """Build the config from a YAML file, the environment and ``key=value`` overrides."""
    env = os.environ if env is None else env
    tree: dict[str, Any] = {}
    origins: dict[tuple[str, ...], str] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist; check the path given to -c") from None
        except OSError as e:
            raise ConfigError(f"config file {p} cannot be read: {e.strerror}") from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections, not {type(loaded).__name__}")
        tree = loaded
        origins = {k: f"{p}:{line}" for k, line in yaml_key_lines(text).items()}
    for name, raw in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            _set_path(tree, dotted, _parse_scalar(raw), origin=f"environment {name}", origins=origins)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {item!r}: expected section.field=value")
        _set_path(tree, key.strip(), _parse_scalar(raw), origin=f"--set {item}", origins=origins)
    token = bearer_token(TOKEN_ENV, environ=env)  # $REWARD_SERVER_TOKEN, else its _FILE
    if token and not tree.get("server", {}).get("auth_token"):
        tree.setdefault("server", {})["auth_token"] = token
    try:
        return RewardServerConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(
            format_errors(e, root=RewardServerConfig, tree=tree, origins=origins)
        ) from None
