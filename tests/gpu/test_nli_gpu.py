"""TransformersNLI on CUDA in bf16 (skipped without a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

from reward_server.backends.base import NLIPair  # noqa: E402
from reward_server.backends.settings import TransformersNLISettings  # noqa: E402
from reward_server.backends.tiny_models import build_tiny_nli_model  # noqa: E402
from reward_server.backends.transformers_nli import TransformersNLI  # noqa: E402

PAIRS = [
    NLIPair("The answer is Paris. " * k, f"The content of the answer is about topic {k}.") for k in (1, 5, 20, 60, 200)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_nli_model(tmp_path_factory.mktemp("gpu") / "m", shape="deberta-v3-small")


def _engine(model_dir: Path, device: str, **kw: object) -> TransformersNLI:
    return TransformersNLI.from_settings(
        TransformersNLISettings(model=str(model_dir), device=device, **kw)
    )


async def test_bf16_on_gpu_close_to_fp32_cpu(model_dir: Path) -> None:
    gpu = _engine(model_dir, "cuda")
    assert gpu.token_budget >= 16384  # GPU default budget
    cpu = _engine(model_dir, "cpu")
    g = await gpu.entailment(PAIRS)
    c = await cpu.entailment(PAIRS)
    for a, b in zip(g, c, strict=True):
        assert a.entailment == pytest.approx(b.entailment, abs=0.03)
        assert a.truncated == b.truncated
    assert g[-1].truncated  # 200 x 5 tokens > 512


async def test_gpu_batched_equals_single_fp32(model_dir: Path) -> None:
    gpu = _engine(model_dir, "cuda", dtype="float32")
    batched = await gpu.entailment(PAIRS)
    single = [(await gpu.entailment([p]))[0] for p in PAIRS]
    for a, b in zip(batched, single, strict=True):
        assert a.entailment == pytest.approx(b.entailment, abs=1e-4)
