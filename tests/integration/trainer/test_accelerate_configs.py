"""The DeepSpeed configs we ship for the TRL engine load with accelerate's own config classes,
and our runner builds its GRPOTrainer under each (`accelerate launch --config_file ...`, one
process, DeepSpeed's CPU accelerator here; on a GPU machine num_processes is the GPU count)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="the TRL engine needs the trl extra: pip install -e .[trl]")

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "trainer" / "config" / "accelerate"
PROBE = Path(__file__).with_name("accelerate_probe.py")


@pytest.mark.parametrize("stage", [2, 3])
def test_the_config_loads_with_accelerates_own_classes(stage: int) -> None:
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    config = load_config_from_file(str(CONFIGS / f"zero{stage}.yaml"))
    assert isinstance(config, ClusterConfig)
    assert str(config.distributed_type).endswith("DEEPSPEED")
    assert config.deepspeed_config["zero_stage"] == stage
    assert config.mixed_precision == "bf16" and config.use_cpu is False


@pytest.mark.e2e  # accelerate launch: DeepSpeed, TRL and SmolLM2 in a process of their own
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("stage", [2, 3])
def test_our_runner_builds_a_trainer_under_the_config(stage: int, tmp_path, smollm2_path) -> None:
    pytest.importorskip("deepspeed", reason="DeepSpeed is the deepspeed extra: pip install -e .[deepspeed]")
    from trainer.data.prepare import build_rows, sample_records, to_trl, write_parquet

    model = smollm2_path
    rows = to_trl(build_rows(sample_records(history_limit=1)[:1], "personalized_generator", history_limit=1))
    write_parquet(rows, tmp_path / "data" / "trl_train.parquet")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    assert accelerate, "accelerate's CLI sits beside this Python"
    proc = subprocess.run(
        [accelerate, "launch", "--config_file", str(CONFIGS / f"zero{stage}.yaml"),
         "--num_processes", "1", "--mixed_precision", "no",  # one CPU process here
         str(PROBE), str(tmp_path / "data"), str(tmp_path / "run"), str(model)],
        capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    seen = json.loads(line.removeprefix("PROBE "))
    assert seen["distributed_type"].endswith("DEEPSPEED") and seen["deepspeed"] is True
    assert seen["zero_stage"] == stage
    assert seen["ref_model_wrapped"] is not None  # TRL's prepare_deepspeed wrapped the reference
