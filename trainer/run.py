"""Train a rubric generator or a personalized generator with GRPO against the reward server.

On a Ray cluster (the way to run it; the cluster must run the project's environment)::

    ray job submit --working-dir . -- python trainer/run.py --engine trl \\
        --data $PWD/data/pg --reward-server HOST:50051 --output-dir $PWD/runs --max-steps 10

    ray job submit --working-dir . -- python trainer/run.py --engine verl \\
        --preset rubric_generator --reward-server HOST:50051 --output-dir /shared/runs \\
        data.train_files=/shared/data/parl_a/train.parquet data.val_files=/shared/data/parl_a/val.parquet

verl: everything after the options is a Hydra override of verl's config (key=value).
TRL also runs directly (``python trainer/run.py --engine trl ...``; CPU is fine, SmolLM2-135M
by default), or under ``accelerate launch --config_file trainer/config/accelerate/zero2.yaml``.

Outputs land in ``<output-dir>/<run-name>/`` (absolute, printed at start and end): the model
(TRL: ``model/``, and ``checkpoint-N/`` every ``--save-steps``; verl: ``checkpoints/``),
``run_log.jsonl``, ``reward.png`` and ``provenance.json`` (the reward server's Info).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python trainer/run.py`: make the repo root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer import deps  # stdlib only: checked before anything that needs the packages

logger = logging.getLogger("trainer.run")
RAY_PACKAGE_DIR = "runtime_resources"  # Ray unpacks a job's working_dir below <session>/runtime_resources


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainer/run.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=("verl", "trl"), required=True)
    p.add_argument("--preset", choices=("rubric_generator", "personalized_generator"),
                   default="rubric_generator", help="verl: trainer/config/<preset>.yaml")
    p.add_argument("--check-config", action="store_true",
                   help="verl: compose and check the config (ours and verl's checks), print it, do not train")
    p.add_argument("--data", type=Path, help="trl: folder (or trl_train.parquet) from prepare")
    p.add_argument("--reward-server", default=os.environ.get("REWARD_SERVER_ADDRESS"),
                   help="host:port of the reward server, or several comma-separated (one ingress per "
                   "node: calls are spread round robin) (default $REWARD_SERVER_ADDRESS)")
    p.add_argument("--output-dir", type=Path, default=Path("runs"),
                   help="runs go to <output-dir>/<run-name>; inside a Ray job give an absolute path "
                        "(relative ones would land in Ray's package cache)")
    p.add_argument("--run-name", help="default: <engine>-<task>-<YYYYmmdd-HHMMSS>")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in an existing <output-dir>/<run-name> from its last checkpoint")
    p.add_argument("--report-to", default="none",
                   help="where metrics go besides run_log.jsonl: none, or a comma list of "
                        "tensorboard, wandb, trackio (as TRL; for verl: trainer.logger)")
    g = p.add_argument_group("TRL")
    g.add_argument("--model", help="HF id or local folder (default: local SmolLM2-135M-Instruct)")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when present (accelerate launch decides under DeepSpeed)")
    g.add_argument("--max-steps", type=int, default=10)
    g.add_argument("--save-steps", type=int, default=0,
                   help="also save a checkpoint every N steps (0: only the final model)")
    g.add_argument("--learning-rate", type=float, default=1e-5)
    g.add_argument("--prompts-per-step", type=int, default=2)
    g.add_argument("--num-generations", type=int, default=4)
    g.add_argument("--max-completion-length", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.6)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-reward-prefetch", dest="reward_prefetch", action="store_false",
                   help="call the reward server after TRL's reference forward, not during it")
    r = p.add_argument_group("reward calls (both engines; verl: reward_kwargs)")
    r.add_argument("--attempts", type=int, help="tries of a call answered UNAVAILABLE or "
                   "RESOURCE_EXHAUSTED (default 5)")
    r.add_argument("--backoff-cap-s", type=float, help="longest backoff between tries (default 5)")
    r.add_argument("--deadline-s", type=float, help="one call in all, waiting for a restarting "
                   "server included (default 120)")
    r.add_argument("--mask-infra-failures", action="store_true",
                   help="mask a sample whose reward call failed instead of failing it")
    return p


def run_dir(args: argparse.Namespace, task: str) -> Path:
    """``<output-dir>/<run-name>``, absolute; refuses a relative path inside a Ray job and an
    existing run (unless ``--resume``)."""
    out = args.output_dir.expanduser()
    if not out.is_absolute():
        if RAY_PACKAGE_DIR in Path.cwd().parts:
            raise SystemExit(
                f"--output-dir {out} is relative, and this Ray job runs in Ray's package cache "
                f"({Path.cwd()}): its outputs would be deleted with it. Pass an absolute path, "
                "e.g. `--output-dir $PWD/runs` (your shell expands $PWD before submitting)."
            )
        out = Path.cwd() / out
    name = args.run_name or f"{args.engine}-{task}-{time.strftime('%Y%m%d-%H%M%S')}"
    path: Path = out.resolve() / name
    if path.exists() and not args.resume:
        raise SystemExit(f"{path} exists: runs never overwrite each other. Pick another --run-name, "
                         "or pass --resume to continue it.")
    path.mkdir(parents=True, exist_ok=True)
    return path


def report_to(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
    bad = sorted(set(names) - {"tensorboard", "wandb", "trackio"})
    if bad:
        raise SystemExit(f"--report-to: unknown {bad}; use none or tensorboard, wandb, trackio")
    return names


def budget_overrides(args: argparse.Namespace) -> dict[str, Any]:
    fields = {"attempts": args.attempts, "backoff_cap_s": args.backoff_cap_s, "deadline_s": args.deadline_s}
    return {k: v for k, v in fields.items() if v is not None}


def verl_overrides(args: argparse.Namespace, overrides: list[str]) -> list[str]:
    prefix = "reward.custom_reward_function.reward_kwargs."
    out = list(overrides)

    def given(key: str) -> bool:
        return any(o.lstrip("+").startswith(key + "=") for o in out)

    if args.reward_server and not given(prefix + "reward_server"):
        # quoted: Hydra would read "a:p,b:q" (several ingresses) as a sweep
        out.append(f"{prefix}reward_server='{args.reward_server}'")
    for key, value in budget_overrides(args).items():
        if not given(prefix + key):
            out.append(f"{prefix}{key}={value}")
    if args.mask_infra_failures:
        out += [f"{prefix}mask_infra_failures=true", "algorithm.adv_estimator=grpo_masked"]
    if args.report_to != "none" and not given("trainer.logger"):
        out.append(f"trainer.logger=[console,{','.join(report_to(args.report_to))}]")
    return out


def main_verl(args: argparse.Namespace, overrides: list[str]) -> int:
    from hydra.errors import ConfigCompositionException

    from reward_server.client import RewardCallError
    from reward_server.config import ConfigError
    from trainer import verl_runner

    overrides = verl_overrides(args, overrides)
    try:
        if args.check_config:
            from omegaconf import OmegaConf

            config = verl_runner.compose(args.preset, overrides)
            verl_runner.check(config, args.preset)
            sys.stdout.write(OmegaConf.to_yaml(config))
            print(f"verl config of preset {args.preset!r} is valid", file=sys.stderr)
            return 0
        path = run_dir(args, args.preset)
        print(f"run directory: {path}", flush=True)
        verl_runner.run(args.preset, overrides, run_dir=path)
    except (ConfigError, RewardCallError, ConfigCompositionException) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot_verl(args.preset, overrides, path)
    print(f"checkpoints: {path / 'checkpoints'}\nrun log:     {path / 'run_log.jsonl'}\n"
          f"plot:        {path / 'reward.png'}\nprovenance:  {path / 'provenance.json'}", flush=True)
    return 0


def plot_verl(preset: str, overrides: list[str], path: Path) -> None:
    """The reward plot of a verl run, titled with its reward kinds and models."""
    from trainer import verl_runner
    from trainer.run_log import data_kinds, plot_rewards, plot_title

    config = verl_runner.compose(preset, overrides)
    train = config.data.train_files
    files = [train] if isinstance(train, str) else [str(f) for f in train]  # str or ListConfig
    kinds = sorted({k for f in files if Path(f).is_file() for k in data_kinds(Path(f))})
    title = plot_title(f"verl ({preset})", kinds=kinds,
                       policy=str(config.actor_rollout_ref.model.path), run_dir=path)
    plot_rewards(path / "run_log.jsonl", path / "reward.png", title=title)


def main_trl(args: argparse.Namespace) -> int:
    from reward_server.client import RetryBudget
    from trainer.trl_runner import TrlRunSettings, run_trl

    if args.data is None or not args.reward_server:
        parser().error("--engine trl needs --data and --reward-server (or $REWARD_SERVER_ADDRESS)")
    path = run_dir(args, args.data.name)
    print(f"run directory: {path}", flush=True)
    result = run_trl(TrlRunSettings(
        data=args.data.expanduser().resolve(), output_dir=path, reward_server=args.reward_server,
        model=args.model, device=args.device, max_steps=args.max_steps, save_steps=args.save_steps,
        learning_rate=args.learning_rate, prompts_per_step=args.prompts_per_step,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=args.temperature, seed=args.seed, report_to=report_to(args.report_to),
        retry=RetryBudget(**budget_overrides(args)),
        token=os.environ.get("REWARD_SERVER_TOKEN"), mask_infra_failures=args.mask_infra_failures,
        resume=args.resume, prefetch_reward=args.reward_prefetch,
    ))
    if result["model"] is not None:  # on the main process
        print(f"model:      {result['model']}\nrun log:    {result['log']}\nplot:       {result['plot']}"
              f"\nprovenance: {result['provenance_path']}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args, overrides = parser().parse_known_args(argv)
    problem = deps.check(args.engine)
    if problem:
        print(problem, file=sys.stderr)
        return 3
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.engine == "verl":
        return main_verl(args, overrides)
    if overrides:
        parser().error(f"unrecognized arguments for --engine trl: {' '.join(overrides)}")
    return main_trl(args)


if __name__ == "__main__":
    sys.exit(main())
