"""Early starts for the end-to-end suite: work that only waits on the network begins as soon as
collection finds the test that needs it, and runs while the tests before it do.

- The images' resolution against the package index (tests/e2e/test_image_resolution.py): pip's
  ``--dry-run --report`` of each image's extras, both at once, ~80 s of mostly network waits."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"reward-server": "server,gpu", "training": "train,rollout,trl"}


@dataclass
class Resolution:
    """One image's ``pip install --dry-run --report`` of this checkout with its extras, running."""

    extras: str
    proc: subprocess.Popen[bytes]
    report: Path
    stderr: Path

    @classmethod
    def start(cls, extras: str, out: Path) -> Resolution:
        report, stderr = out / f"{extras}.json", out / f"{extras}.err"
        with stderr.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                 "--report", str(report), f"{ROOT}[{extras}]"],
                stdout=subprocess.DEVNULL, stderr=err,
            )
        return cls(extras, proc, report, stderr)

    def wait(self, timeout_s: float) -> tuple[int, str]:
        """pip's exit status and its stderr, once it is done."""
        rc = self.proc.wait(timeout_s)
        return rc, self.stderr.read_text(errors="replace")


RESOLVING = pytest.StashKey[dict[str, Resolution]]()
RESOLVING_DIR = pytest.StashKey[Path]()


def start_resolving(config: pytest.Config) -> dict[str, Resolution]:
    """Both images' resolutions, started at once (network-bound) and kept in the run's stash."""
    if RESOLVING not in config.stash:
        out = Path(tempfile.mkdtemp(prefix="image-resolution-"))
        config.stash[RESOLVING_DIR] = out
        config.stash[RESOLVING] = {image: Resolution.start(extras, out) for image, extras in IMAGES.items()}
    return config.stash[RESOLVING]


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if any(item.path.name == "test_image_resolution.py" for item in session.items):
        start_resolving(session.config)


def pytest_unconfigure(config: pytest.Config) -> None:
    for resolution in config.stash.get(RESOLVING, {}).values():
        if resolution.proc.poll() is None:  # the run ended before its test read it
            resolution.proc.kill()
            resolution.proc.wait()
    if RESOLVING_DIR in config.stash:
        shutil.rmtree(config.stash[RESOLVING_DIR], ignore_errors=True)
