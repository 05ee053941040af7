"""trainer/run.py's held-out and sampling options are checked before anything loads: one line,
exit 2, no run folder."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from trainer import run
from trainer.data import prepare


@pytest.fixture(scope="module")
def no_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    assert prepare.main(["--sample", "--task", "personalized_generator", "--reward-kind", "rubric_score",
                         "--val-size", "0", "--out", str(out)]) == 0
    assert not (out / "trl_val.parquet").exists()
    return out


@pytest.mark.parametrize(("extra", "says"), [
    (["--eval-steps", "5"], "--eval-steps: no held-out split"),
    (["--eval-steps", "-1"], "--eval-steps and --top-k must be >= 0"),
    (["--top-k", "-3"], "--eval-steps and --top-k must be >= 0"),
    (["--eval-steps", "0", "--eval-generations", "1"], None),  # no evaluation: not checked
])
def test_bad_held_out_options_stop_before_the_server_is_asked(no_val: Path, tmp_path: Path, capsys,
                                                              extra: list[str], says: str | None) -> None:
    argv = ["--engine", "trl", "--data", str(no_val), "--reward-server", "127.0.0.1:9",
            "--probe-timeout-s", "0.5", "--output-dir", str(tmp_path / "runs"), *extra]
    assert run.main(argv) == 2
    err = capsys.readouterr().err
    if says is None:  # got as far as the (absent) server
        assert "not reachable" in err
    else:
        assert says in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_one_completion_per_held_out_prompt_is_refused(no_val: Path, tmp_path: Path, capsys) -> None:
    argv = ["--engine", "trl", "--data", str(no_val), "--reward-server", "127.0.0.1:9",
            "--output-dir", str(tmp_path / "runs"), "--eval-steps", "5", "--eval-generations", "1"]
    assert run.main(argv) == 2
    assert "--eval-generations must be >= 2" in capsys.readouterr().err
