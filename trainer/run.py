"""Train a rubric generator or a personalized generator with GRPO against the reward server.

verl (GPU; on a Ray cluster submit it with ``ray job submit --working-dir . -- python
trainer/run.py --engine verl ...``)::

    python trainer/run.py --engine verl --preset rubric_generator \\
        data.train_files=data/parl_a/train.parquet data.val_files=data/parl_a/val.parquet \\
        reward.custom_reward_function.reward_kwargs.reward_server=HOST:50051

    Everything after the options is a Hydra override of verl's config (key=value).

TRL (CPU is fine; SmolLM2-135M-Instruct by default)::

    python trainer/run.py --engine trl --data data/parl_a --reward-server 127.0.0.1:50051 \\
        --output-dir runs/trl_parl_a --max-steps 10
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # `python trainer/run.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

logger = logging.getLogger("trainer.run")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainer/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("verl", "trl"), required=True)
    p.add_argument("--preset", choices=("rubric_generator", "personalized_generator"),
                   default="rubric_generator", help="verl: trainer/config/<preset>.yaml")
    p.add_argument("--check-config", action="store_true",
                   help="verl: compose and validate the config, print it, do not train")
    p.add_argument("--data", type=Path, help="trl: folder (or trl_train.parquet) from prepare")
    p.add_argument("--reward-server", default=os.environ.get("REWARD_SERVER_ADDRESS"),
                   help="host:port of the reward server (default $REWARD_SERVER_ADDRESS)")
    p.add_argument("--output-dir", type=Path, default=Path("runs/trl"))
    p.add_argument("--model", help="trl: HF id or local folder (default: local SmolLM2-135M)")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument("--num-generations", type=int, default=4)
    p.add_argument("--max-completion-length", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0)
    p.add_argument("--mask-infra-failures", action="store_true",
                   help="mask a sample whose reward call failed instead of stopping")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = parser().parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.engine == "verl":
        from trainer import verl_runner

        if args.reward_server and not any(o.startswith(
                "reward.custom_reward_function.reward_kwargs.reward_server=") for o in overrides):
            overrides.append(
                f"reward.custom_reward_function.reward_kwargs.reward_server={args.reward_server}")
        if args.mask_infra_failures:
            overrides += ["reward.custom_reward_function.reward_kwargs.mask_infra_failures=true",
                          "algorithm.adv_estimator=grpo_masked"]
        if args.check_config:
            from omegaconf import OmegaConf

            config = verl_runner.compose(args.preset, overrides)
            verl_runner.validate(config)
            sys.stdout.write(OmegaConf.to_yaml(config))
            return 0
        verl_runner.run(args.preset, overrides)
        return 0
    if overrides:
        parser().error(f"unrecognized arguments for --engine trl: {' '.join(overrides)}")
    if args.data is None or not args.reward_server:
        parser().error("--engine trl needs --data and --reward-server (or $REWARD_SERVER_ADDRESS)")
    from trainer.trl_runner import TrlRunSettings, run_trl

    result = run_trl(TrlRunSettings(
        data=args.data, output_dir=args.output_dir, reward_server=args.reward_server,
        model=args.model, max_steps=args.max_steps, learning_rate=args.learning_rate,
        prompts_per_step=args.prompts_per_step, num_generations=args.num_generations,
        max_completion_length=args.max_completion_length, temperature=args.temperature,
        seed=args.seed, timeout_s=args.timeout_s, token=os.environ.get("REWARD_SERVER_TOKEN"),
        mask_infra_failures=args.mask_infra_failures,
    ))
    logger.info("run log: %s  reward plot: %s", result["log"], result["plot"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
