"""VLLMJudge on a real GPU: SmolLM2 (local conversion) agrees with the transformers judge."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
pytest.importorskip("vllm")

from reward_server.backends.base import GenerationRequest  # noqa: E402
from reward_server.backends.smollm2 import local_smollm2_path  # noqa: E402
from reward_server.domain import Task  # noqa: E402
from reward_server.rubric.templates import judge_prompts  # noqa: E402

pytestmark = pytest.mark.gpu

RULES = ("The review is written in lowercase.", "The review mentions the price.", "The review ends with '!'.")


async def test_vllm_matches_transformers() -> None:
    from reward_server.backends.transformers_judge import TransformersJudge
    from reward_server.backends.vllm_judge import VLLMJudge

    path = str(local_smollm2_path())
    prompts = judge_prompts("Blender, 5 stars", "I love it! Cheap and great!", RULES, Task.AMAZON)
    prompts += judge_prompts("Toaster, 1 star", "terrible. burnt my bread.", RULES, Task.AMAZON)
    ref = TransformersJudge(path, device="cuda", dtype="float32").p_yes_sync(prompts)
    judge = VLLMJudge(path, dtype="float32", gpu_memory_utilization=0.3, max_model_len=2048)
    try:
        got = await judge.p_yes(prompts)
        assert all(0.0 <= p <= 1.0 for p in got)
        assert max(abs(a - b) for a, b in zip(got, ref, strict=True)) < 1e-3  # exact method: fp32 numerics only
        (text,) = await judge.generate([GenerationRequest(system="You help.", user="Name a fruit.", max_new_tokens=8)])
        assert text.strip()
    finally:
        await judge.close()
