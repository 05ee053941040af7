"""Joining a Ray cluster: fail in seconds, with the fix, when Ray's token auth refuses us.

Ray 2.60 turns token authentication on for every cluster it starts (``ray start``,
``ray.init()``) unless ``RAY_AUTH_MODE=disabled``. A process joining such a cluster needs
``RAY_AUTH_MODE=token`` and the cluster's token (``$RAY_AUTH_TOKEN``, the file
``$RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``); without them ``ray.init(address=...)``
prints ``InvalidAuthToken`` for ~20 s and ends in a bare ``ConnectionError``.
:func:`check_cluster` asks the cluster's GCS once, before ``ray.init``, and turns a refusal into
a :class:`~reward_server.errors.ConfigError` that says what to set; so is an address where
nothing listens (``ray.init`` would retry for a minute, then raise a bare ConnectionError).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import stat
import sys
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from reward_server.errors import ConfigError

logger = logging.getLogger(__name__)
AUTH_MODE_ENV = "RAY_AUTH_MODE"
# Ray 2.60 turns a node address of 127.0.0.1 into the machine's address (``ray start`` and
# ``ray.init`` alike: ``services.resolve_ip_for_localhost``), so gcs_server, raylet, the agents
# and every worker listen beyond loopback. With this variable at 0 (meant for Windows/macOS,
# where Ray runs single-node) Ray keeps loopback as the node address and every listener with it;
# a node can then not join from another machine (``ray start --address`` refuses to run).
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def keep_local_ray_on_loopback(*, local_node_ip: str) -> bool:
    """Make a Ray that this process is about to start listen on loopback only, when its node
    address is loopback: sets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (unless the user set it)
    before ``ray`` is imported (Ray reads it once, at import). False when that is too late or
    the address is not loopback; the embedded Ray then listens on the machine's address, with
    token auth as the guard."""
    if not is_loopback(local_node_ip):
        return False
    if "ray" in sys.modules:
        logger.debug("ray already imported: its listeners follow %s as set at import", SINGLE_NODE_ENV)
        return os.environ.get(SINGLE_NODE_ENV) == "0"
    os.environ.setdefault(SINGLE_NODE_ENV, "0")
    return os.environ[SINGLE_NODE_ENV] == "0"


def private_ray_token(env: Mapping[str, str] | None = None, *, home: Path | None = None) -> Path | None:
    """Before this process starts a local Ray: the token file that Ray will use is this user's
    alone. Ray 2.60's ``ray.init()`` writes a missing ``~/.ray/auth_token`` with the umask's
    mode (0644, as ``ray get-auth-token --generate`` does): make it here first, the way Ray
    would (64 hex digits) but 0600 in a 0700 ``~/.ray``, and make an existing one of this user
    that others can read 0600. Nothing when token auth is off (``RAY_AUTH_MODE``; unset means
    on for a cluster Ray starts) or the token is a value (``RAY_AUTH_TOKEN``). Returns the file."""
    env = os.environ if env is None else env
    if env.get(AUTH_MODE_ENV, "token").lower() != "token" or env.get("RAY_AUTH_TOKEN"):
        return None
    named = env.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named) if named else (home or Path.home()) / ".ray" / "auth_token"
    if not named:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            logger.info("Ray token auth: made the token file %s (mode 0600)", path)
            return path
    try:
        st = path.stat()
    except OSError:
        return None  # a named file that is missing: Ray says so
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        path.chmod(0o600)
        logger.warning("Ray token file %s was readable by other users (%s); made it 0600", path,
                       stat.filemode(st.st_mode))
    return path


def auth_fix(address: str, detail: str) -> str:
    mode = os.environ.get(AUTH_MODE_ENV)
    have = f"{AUTH_MODE_ENV}={mode}" if mode else f"{AUTH_MODE_ENV} unset (= disabled for a client)"
    return (
        f"the Ray cluster at {address} refused this process ({detail.split('. ')[0][:200]}; "
        f"this process: {have}). Ray 2.60 clusters require a token unless started with "
        f"{AUTH_MODE_ENV}=disabled. Fix: export {AUTH_MODE_ENV}=token and give this process the "
        "cluster's token, as RAY_AUTH_TOKEN=<token>, RAY_AUTH_TOKEN_PATH=<file> or the file "
        "~/.ray/auth_token (`ray get-auth-token` on the head node prints it); for a cluster "
        f"started with {AUTH_MODE_ENV}=disabled, export {AUTH_MODE_ENV}=disabled."
    )


def resolve(address: str) -> str | None:
    """``host:port`` of the GCS for ``address`` (``auto`` included); None for a Ray client
    address (``ray://``) or when there is nothing to join."""
    if address.startswith("ray://"):
        return None
    from ray._private.services import canonicalize_bootstrap_address

    try:
        gcs: str | None = canonicalize_bootstrap_address(address)
        return gcs
    except (ValueError, ConnectionError) as e:
        raise ConfigError(f"Ray address {address!r}: {str(e).rstrip('.')}; give host:port of the head's GCS "
                          "(`ray start --head` prints it) or `auto` on a cluster node") from None


def unreachable_fix(address: str, gcs: str, detail: str) -> str:
    shown = address if address == gcs else f"{address} (GCS {gcs})"
    return (
        f"cannot reach the Ray cluster at {shown}: {detail}. Is it running? Start one with "
        "`ray start --head` (it prints the address), or point --address / serving.ray.address "
        "/ RAY_ADDRESS at a running head's GCS (host:port, default port 6379); without an "
        "address `reward-server serve --ray` starts a local Ray of its own."
    )


def _reachable(address: str, gcs: str, timeout_s: float) -> None:
    """Raise :class:`ConfigError` when nothing accepts a TCP connection at the GCS address
    (``ray.init`` would retry for a minute and end in a bare ConnectionError)."""
    host, _, port = gcs.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return
    except TimeoutError:
        detail = f"no answer within {timeout_s:.0f}s"
    except (OSError, ValueError) as e:
        detail = getattr(e, "strerror", None) or str(e)
    raise ConfigError(unreachable_fix(address, gcs, detail)) from None


def _probe(gcs: str) -> None:
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    GcsClient(address=gcs).internal_kv_get(b"reward_server_probe", None, timeout=5)


def check_cluster(address: str, *, timeout_s: float = 15.0) -> None:
    """Raise :class:`ConfigError` when nothing listens at ``address`` or the cluster refuses
    our token auth, each with the fix. Anything else is left to ``ray.init``."""
    from ray.exceptions import AuthenticationError

    gcs = resolve(address)
    if gcs is None:
        return
    _reachable(address, gcs, min(timeout_s, 5.0))
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(_probe, gcs).result(timeout_s)
    except AuthenticationError as e:
        raise ConfigError(auth_fix(address, str(e))) from None
    except FutureTimeout:
        logger.warning("Ray GCS at %s did not answer within %.0fs; trying ray.init anyway", gcs, timeout_s)
    except Exception as e:
        logger.debug("Ray GCS probe of %s: %r", gcs, e)
    finally:
        pool.shutdown(wait=False)
