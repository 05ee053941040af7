"""Generate reward_server/_proto from protos/ (package-absolute imports); --check fails on drift.

    python scripts/gen_proto.py          # regenerate
    python scripts/gen_proto.py --check  # exit 1 if the committed code differs from the proto
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "protos"
OUT = ROOT / "reward_server" / "_proto"
PROTOS = ["reward/v1/reward.proto"]
DESCRIPTOR_SET = "descriptors.binpb"


def generate(dest: Path) -> None:
    from grpc_tools import protoc  # dev dependency (grpcio-tools)

    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={dest}",
        f"--pyi_out={dest}",
        f"--grpc_python_out={dest}",
        # the descriptors reflection serves, with the proto's comments (source info)
        "--include_source_info",
        f"--descriptor_set_out={dest / DESCRIPTOR_SET}",
        *[str(PROTO_ROOT / p) for p in PROTOS],
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    for path in dest.rglob("*.py"):
        text = path.read_text()
        fixed = re.sub(r"^from reward\.v1 import", "from reward_server._proto.reward.v1 import", text, flags=re.M)
        path.write_text(fixed)
    for d in [dest, *[p for p in dest.rglob("*") if p.is_dir()]]:
        (d / "__init__.py").touch()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if committed code drifts")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_proto"
        fresh.mkdir()
        generate(fresh)
        if args.check:
            drift = []
            fresh_files = {p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file()}
            have_files = {p.relative_to(OUT) for p in OUT.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
            drift += [f"missing: {p}" for p in sorted(fresh_files - have_files)]
            drift += [f"extra: {p}" for p in sorted(have_files - fresh_files)]
            for p in sorted(fresh_files & have_files):
                if not filecmp.cmp(fresh / p, OUT / p, shallow=False):
                    drift.append(f"differs: {p}")
            if drift:
                print("generated code drifts from protos/ (run: python scripts/gen_proto.py):", file=sys.stderr)
                for line in drift:
                    print("  " + line, file=sys.stderr)
                return 1
            print("generated code matches protos/")
            return 0
        if OUT.exists():
            shutil.rmtree(OUT)
        shutil.copytree(fresh, OUT)
        print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
