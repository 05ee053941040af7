"""Application builders for Ray Serve config files (``serve deploy``, KubeRay RayService).

``deploy/serve_config.yaml`` names them as ``import_path``::

    - name: reward-judge
      import_path: reward_server.serving.app:judge_app
      args: {config: /etc/reward-server/config.yaml, overrides: ["judge.kind=vllm"]}

``args`` are read with :func:`reward_server.config.load_config` (a YAML file path, ``key=value``
overrides, and the ``REWARD_SERVER__*`` environment of the Serve controller). Deployment
options in the config file's ``deployments:`` section take precedence over the ones derived
from ``serving.judge`` / ``serving.nli`` here (Serve's rule: config file over code).
"""

from __future__ import annotations

from typing import Any

from reward_server.config import RewardServerConfig, load_config
from reward_server.errors import ConfigError


def _config(args: dict[str, Any]) -> RewardServerConfig:
    unknown = set(args) - {"config", "overrides"}
    if unknown:
        raise ConfigError(
            f"Serve application args {sorted(unknown)} are unknown; use 'config' (a YAML path) "
            "and 'overrides' (a list of section.field=value)"
        )
    overrides = args.get("overrides") or []
    if isinstance(overrides, str):
        overrides = [overrides]
    return load_config(args.get("config"), overrides=list(overrides))


def judge_app(args: dict[str, Any]) -> Any:
    """The judge application (JudgeDeployment) from ``args``."""
    from reward_server.serving._private.runtime import judge_application

    return judge_application(_config(args))


def nli_app(args: dict[str, Any]) -> Any:
    """The NLI application (NLIDeployment) from ``args``."""
    from reward_server.serving._private.runtime import nli_application

    return nli_application(_config(args))
