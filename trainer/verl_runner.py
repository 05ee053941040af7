"""The verl engine: compose verl's Hydra config with our overlays and call verl's own entry.

Nothing of verl's training loop is copied: :func:`compose` builds the config from
``trainer/config/<preset>.yaml`` (whose defaults list starts with verl's ``ppo_trainer``),
:func:`validate` runs verl's own ``validate_config``, and :func:`run` hands the result to
``verl.trainer.main_ppo.run_ppo`` with verl's TaskRunner.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CONFIG_DIR = Path(__file__).resolve().parent / "config"
PRESETS = ("rubric_generator", "personalized_generator")
EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"
REWARD_MODULE = "trainer.reward_fn"


def compose(preset: str, overrides: Sequence[str] = ()) -> Any:
    """verl's ``ppo_trainer`` + ``trainer/config/<preset>.yaml`` + Hydra ``overrides``."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {PRESETS}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return hydra_compose(config_name=preset, overrides=list(overrides))


def validate(config: Any) -> None:
    """verl's own checks (batch sizes, GPU counts, estimator, ...), as ``main_ppo`` runs them."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )


def add_external_module(config: Any) -> None:
    """Make every verl process import trainer.reward_fn (registers ``grpo_masked``)."""
    from omegaconf import open_dict

    current = [m for m in os.environ.get(EXTERNAL_MODULES_ENV, "").split(",") if m]
    if REWARD_MODULE not in current:
        current.append(REWARD_MODULE)
    os.environ[EXTERNAL_MODULES_ENV] = ",".join(current)
    with open_dict(config):
        env = config.ray_kwargs.ray_init.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env[EXTERNAL_MODULES_ENV] = ",".join(current)


def run(preset: str, overrides: Sequence[str] = ()) -> None:
    """Compose, validate and train with verl (GPU cluster or node; see the README recipe)."""
    from verl.trainer.main_ppo import run_ppo
    from verl.utils.device import auto_set_device

    import trainer.reward_fn  # noqa: F401  registers grpo_masked in this process

    config = compose(preset, overrides)
    auto_set_device(config)
    validate(config)
    add_external_module(config)
    runner: Any
    if config.trainer.use_v1:
        from verl.trainer import main_ppo

        runner = main_ppo.TaskRunnerV1
    else:  # verl's legacy trainer (trainer.use_v1=false)
        from verl.trainer import main_ppo_v0

        runner = main_ppo_v0.TaskRunner
    logger.info("verl preset %s, reward fn %s, reward kwargs %s", preset,
                config.reward.custom_reward_function.path,
                dict(config.reward.custom_reward_function.reward_kwargs))
    run_ppo(config, task_runner_class=runner)
