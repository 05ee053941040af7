"""Where a TRL GRPO step's time goes: one ``time/<section>`` figure per step, in seconds.

The sections are timed by overriding the ``GRPOTrainer`` methods that do the work (a subclass,
as :func:`trainer.trl_runner.prefetching_trainer` does; TRL itself is not patched) and by
transformers' optimizer-step callbacks:

==================  =====================================================================
``time/generate``    ``_generate``: tokenizing the prompts and sampling the completions
``time/ref_forward`` the reference model's log-probs (``beta > 0``), no gradients
``time/old_forward`` the old policy's log-probs (only when a generation is reused)
``time/reward``      ``_calculate_rewards``: what the step waited for its rewards (with the
                     reward prefetch the Score call itself runs during ``ref_forward``)
``time/prepare_other`` the rest of ``_prepare_inputs``: padding, advantages, TRL's metrics
``time/policy_forward`` the policy's forward with gradients (log-probs and entropies)
``time/loss_other``  the rest of ``compute_loss``: the GRPO loss terms
``time/backward``    the rest of ``training_step``: ``accelerator.backward``
``time/optimizer``   ``optimizer.step()`` (gradient clipping is in ``time/other``)
``time/log``         ``log`` (metrics, run log, reporters) of the PREVIOUS step, which ends
                     after ``on_step_end``
``time/other``       the step's wall time (``on_step_begin`` to the next one) less the above
``time/step``        that wall time
==================  =====================================================================

Each figure is added to TRL's own per-step metrics, so it lands in ``run_log.jsonl`` and in
every ``--report-to`` backend; :func:`profile_line` formats one step for the console.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

SECTIONS = ("generate", "ref_forward", "old_forward", "reward", "prepare_other", "policy_forward",
            "loss_other", "backward", "optimizer", "log", "other")
PREFIX = "time/"


class StepClock:
    """Seconds per section of the current step; :meth:`close` turns them into the step's row."""

    def __init__(self) -> None:
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.step_start: float | None = None
        self.carried_log = 0.0  # the previous step's log(), which ran after its on_step_end

    @contextmanager
    def timed(self, section: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.spent[section] += time.perf_counter() - start

    def begin(self) -> None:
        now = time.perf_counter()
        self.step_start = now
        self.spent.clear()
        self.spent["log"] = self.carried_log
        self.carried_log = 0.0

    def close(self) -> dict[str, float]:
        """The step's sections (derived ones computed), ``other`` and ``step`` included."""
        if self.step_start is None:
            return {}
        wall = time.perf_counter() - self.step_start + self.spent["log"]
        s = self.spent
        row = {
            "generate": s["generate"], "ref_forward": s["ref_forward"], "old_forward": s["old_forward"],
            "reward": s["reward"],
            "prepare_other": s["prepare"] - s["generate"] - s["ref_forward"] - s["old_forward"] - s["reward"],
            "policy_forward": s["policy_forward"],
            "loss_other": s["compute_loss"] - s["policy_forward"],
            "backward": s["training_step"] - s["prepare"] - s["compute_loss"],
            "optimizer": s["optimizer"], "log": s["log"],
        }
        row["other"] = wall - sum(row.values())
        row["step"] = wall
        self.step_start = None
        return row


def profiling_trainer(base: type[Any]) -> type[Any]:
    """``base`` (a ``GRPOTrainer`` class) with its step timed per section (module doc)."""
    import torch
    from transformers import TrainerCallback

    class StepClockCallback(TrainerCallback):  # type: ignore[misc]
        def __init__(self, owner: Any) -> None:
            self.owner = owner
            self._opt_start = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.owner.step_clock.begin()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self._opt_start = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.owner.step_clock.spent["optimizer"] += time.perf_counter() - self._opt_start

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            row = self.owner.step_clock.close()
            self.owner.last_step_times = row
            for key, value in row.items():
                self.owner._metrics["train"][PREFIX + key].append(value)

    class ProfilingGRPOTrainer(base):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.step_clock = StepClock()
            self.last_step_times: dict[str, float] = {}
            self.add_callback(StepClockCallback(self))

        def _generate(self, *args: Any, **kwargs: Any) -> Any:
            with self.step_clock.timed("generate"):
                return super()._generate(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model: Any, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():
                section = "policy_forward"
            else:
                section = "ref_forward" if model is self.ref_model and model is not None else "old_forward"
            with self.step_clock.timed(section):
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            with self.step_clock.timed("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            with self.step_clock.timed("prepare"):
                return super()._prepare_inputs(*args, **kwargs)

        def compute_loss(self, *args: Any, **kwargs: Any) -> Any:
            with self.step_clock.timed("compute_loss"):
                return super().compute_loss(*args, **kwargs)

        def training_step(self, *args: Any, **kwargs: Any) -> Any:
            with self.step_clock.timed("training_step"):
                return super().training_step(*args, **kwargs)

        def log(self, *args: Any, **kwargs: Any) -> None:
            start = time.perf_counter()
            try:
                super().log(*args, **kwargs)
            finally:
                if self.model.training:
                    self.step_clock.carried_log += time.perf_counter() - start

    return ProfilingGRPOTrainer


def step_times(logs: Mapping[str, Any]) -> dict[str, float]:
    """The ``time/<section>`` figures of one logged row, by section name."""
    return {k[len(PREFIX):]: float(v) for k, v in logs.items()
            if k.startswith(PREFIX) and isinstance(v, int | float)}


def profile_line(step: int, logs: Mapping[str, Any]) -> str | None:
    """``step N time 12.3s: generate 6.1 (50%), ...`` for a row holding ``time/*`` figures (the
    sections taking under 1% left out), None for one that does not."""
    t = step_times(logs)
    wall = t.get("step")
    if not wall:
        return None
    parts = [f"{name} {t[name]:.2f} ({100 * t[name] / wall:.0f}%)" for name in SECTIONS
             if abs(t.get(name, 0.0)) >= 0.01 * wall]
    return f"step {step} time {wall:.2f}s: " + ", ".join(parts)
