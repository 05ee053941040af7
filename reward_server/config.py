"""Typed configuration: one frozen pydantic tree, loaded from YAML, environment and overrides.

Precedence (later wins): defaults < YAML file < environment ``REWARD_SERVER__SECTION__FIELD``
< ``--set section.field=value`` overrides. Values from the environment and overrides are parsed
as YAML scalars (``true``, ``3``, ``0.5``, ``[a, b]``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from reward_server.errors import ConfigError
from reward_server.nli.settings import NLISettings
from reward_server.rubric.settings import RubricSettings
from reward_server.serving.settings import ServingSettings

ENV_PREFIX = "REWARD_SERVER__"
TOKEN_ENV = "REWARD_SERVER_TOKEN"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServerSettings(_Frozen):
    """The gRPC ingress."""

    host: str = Field("127.0.0.1", description="Address to bind; 0.0.0.0 for all interfaces.")
    port: int = Field(50051, ge=0, le=65535, description="Port to bind; 0 picks a free one.")
    max_batch_items: int = Field(1024, ge=1, description="Most items one Score call may carry.")
    max_text_chars: int = Field(
        32768, ge=1, description="Longest text field (characters) an item may carry."
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest gRPC message received or sent."
    )
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="Calls served at once; more are refused (RESOURCE_EXHAUSTED)."
    )
    default_timeout_s: float = Field(
        300.0, gt=0.0, description="Server-side timeout for calls that arrive without a deadline."
    )
    grace_period_s: float = Field(
        30.0, ge=0.0, description="On SIGTERM: how long in-flight calls may finish."
    )
    drain_delay_s: float = Field(
        2.0,
        ge=0.0,
        description="On SIGTERM: health is NOT_SERVING but calls are still accepted this long, "
        "so load balancers route away before the port closes.",
    )
    auth_token: SecretStr | None = Field(
        None,
        description=f"Bearer token clients must send; also read from ${TOKEN_ENV}. None: no auth.",
    )
    tls_cert_file: Path | None = Field(None, description="PEM certificate chain; enables TLS.")
    tls_key_file: Path | None = Field(None, description="PEM private key for tls_cert_file.")
    reflection: bool = Field(True, description="Serve gRPC server reflection (grpcurl).")
    metrics_port: int | None = Field(
        None, ge=0, le=65535, description="Serve Prometheus /metrics on this port; None: off."
    )
    policy_invalid_penalty: float = Field(
        0.0,
        description="Reward given to a malformed policy output (empty or over-long response) "
        "for rubric_score / nli_constraints items; PARL uses rubric.invalid_floor.",
    )


class JudgeBackendSettings(_Frozen):
    """The judge LLM (rubric evaluator) and rubric generator engine."""

    kind: Literal["fake", "transformers", "vllm", "openai"] = Field(
        "fake", description="Engine: deterministic fake, transformers, in-process vLLM, or an "
        "OpenAI-compatible endpoint."
    )
    model: str = Field(
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        description="HF id or local folder (transformers, vllm); model name (openai).",
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N (transformers).")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on GPU, float32 on CPU."
    )
    max_batch_size: int = Field(32, ge=1, description="Most suffixes run in one forward pass.")
    prefix_cache_size: int = Field(
        64, ge=0, description="Prefix KV entries kept (LRU) across calls; 0 disables the cache."
    )
    base_url: str | None = Field(None, description="openai: endpoint, e.g. http://host:8000/v1.")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: env var holding the key.")
    max_concurrency: int = Field(32, ge=1, description="openai: requests in flight at once.")
    request_timeout_s: float = Field(60.0, gt=0.0, description="openai: deadline per request.")
    gpu_memory_utilization: float = Field(0.85, gt=0.0, le=1.0, description="vllm only.")
    max_model_len: int | None = Field(None, ge=16, description="vllm: context length cap.")
    seed: int = Field(0, description="Base seed for sampled generation.")
    num_threads: int | None = Field(
        None,
        ge=1,
        description="CPU engines: torch intra-op threads for this process (None: torch's default, "
        "one per core). Set 1 when several engines or processes share few cores.",
    )
    coalesce_wait_ms: float = Field(
        2.0,
        ge=0.0,
        description="In-process hosting: concurrent calls arriving within this window are merged "
        "into one engine batch (0: off). Ray Serve hosting batches with @serve.batch instead.",
    )
    coalesce_max_items: int = Field(
        512, ge=1, description="In-process hosting: most items one merged engine call may carry."
    )


class NLIBackendSettings(_Frozen):
    """The NLI cross-encoder engine."""

    kind: Literal["fake", "transformers", "judge"] = Field(
        "fake",
        description="fake (set inclusion), transformers cross-encoder, or judge-as-NLI (asks the "
        "judge LLM; weaker, for when no NLI checkpoint is available).",
    )
    model: str = Field(
        "cross-encoder/nli-deberta-v3-large", description="HF id or local folder (transformers)."
    )
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N.")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="auto: bfloat16 on GPU, float32 on CPU."
    )
    max_length: int = Field(512, ge=8, description="Most tokens per (premise, hypothesis) pair.")
    token_budget: int | None = Field(
        None, ge=16, description="Padded tokens per batch; None: small on CPU, large on GPU."
    )
    coalesce_wait_ms: float = Field(
        2.0,
        ge=0.0,
        description="In-process hosting: concurrent calls arriving within this window are merged "
        "into one engine batch (0: off). Ray Serve hosting batches with @serve.batch instead.",
    )
    coalesce_max_items: int = Field(
        512, ge=1, description="In-process hosting: most items one merged engine call may carry."
    )
    num_threads: int | None = Field(
        None,
        ge=1,
        description="CPU engines: torch intra-op threads for this process (None: torch's default, "
        "one per core). Set 1 when several engines or processes share few cores.",
    )
    quantize_int8: bool = Field(
        False, description="CPU only: int8 dynamic quantization of Linear layers (faster, "
        "slightly different probabilities)."
    )


class LoggingSettings(_Frozen):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Root level.")
    json_format: bool = Field(False, description="One JSON object per log line.")


class RewardServerConfig(_Frozen):
    """Everything the reward server reads. ``reward-server check-config`` validates a file."""

    server: ServerSettings = Field(default_factory=ServerSettings)  # type: ignore[arg-type]
    judge: JudgeBackendSettings = Field(default_factory=JudgeBackendSettings)  # type: ignore[arg-type]
    nli_engine: NLIBackendSettings = Field(default_factory=NLIBackendSettings)  # type: ignore[arg-type]
    rubric: RubricSettings = Field(default_factory=RubricSettings)  # type: ignore[arg-type]
    nli: NLISettings = Field(default_factory=NLISettings)  # type: ignore[arg-type]
    serving: ServingSettings = Field(default_factory=ServingSettings)  # type: ignore[arg-type]
    logging: LoggingSettings = Field(default_factory=LoggingSettings)  # type: ignore[arg-type]


def _set_path(tree: dict[str, Any], dotted: str, value: Any, *, origin: str) -> None:
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
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping of sections, not {type(loaded).__name__}")
        tree = loaded
    for name, raw in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            dotted = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            _set_path(tree, dotted, _parse_scalar(raw), origin=f"environment {name}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected section.field=value")
        _set_path(tree, key.strip(), _parse_scalar(raw), origin=f"override {item!r}")
    token = env.get(TOKEN_ENV)
    if token and not tree.get("server", {}).get("auth_token"):
        tree.setdefault("server", {})["auth_token"] = token
    try:
        return RewardServerConfig.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e, source=str(path) if path else None)) from None


def format_validation_error(error: ValidationError, *, source: str | None = None) -> str:
    where = f" in {source}" if source else ""
    lines = [f"invalid configuration{where}:"]
    for err in error.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(root)"
        lines.append(f"  {loc}: {err['msg']}")
    return "\n".join(lines)
