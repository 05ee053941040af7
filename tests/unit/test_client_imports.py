"""The client and the TRL reward need only the base install (grpcio, protobuf, pydantic): importing
them loads none of the server's or the trainers' heavy packages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "transformers", "trl", "verl", "numpy", "yaml", "datasets", "vllm")


def test_client_and_trl_reward_import_without_heavy_packages() -> None:
    code = ("import json, sys; import reward_server.client, reward_server.integrations.trl, "
            "reward_server.api.rows; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
