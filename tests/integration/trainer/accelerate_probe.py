"""Run under `accelerate launch --config_file trainer/config/accelerate/zero{2,3}.yaml` by
test_accelerate_configs.py: build our runner's GRPOTrainer (no training) and print what
accelerate and TRL made of it, as one JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from trainer.trl_runner import TrlRunSettings, build_trainer


def main() -> None:
    data, out, model = (Path(a) for a in sys.argv[1:4])
    settings = TrlRunSettings(data=data, output_dir=out, reward_server="127.0.0.1:1", model=str(model),
                              device="cpu", max_steps=1, prompts_per_step=1, num_generations=2,
                              max_completion_length=4)
    trainer, _ = build_trainer(settings)
    state = trainer.accelerator.state
    plugin = state.deepspeed_plugin
    print("PROBE " + json.dumps({
        "distributed_type": str(state.distributed_type), "deepspeed": bool(trainer.is_deepspeed_enabled),
        "zero_stage": plugin.zero_stage if plugin else None,
        "ref_model_wrapped": type(trainer.ref_model).__name__ if trainer.ref_model is not None else None,
    }), flush=True)


if __name__ == "__main__":
    main()
