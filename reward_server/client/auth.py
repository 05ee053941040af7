"""The reward server's bearer token, from a file: ``$REWARD_SERVER_TOKEN_FILE``.

One way for every process that sends or checks the token (the trainer, the verl and TRL
integrations, the CLI's client verbs, ``reward-server serve``): the environment names a file
(``ray up``: the copy ``file_mounts`` syncs to every node; KubeRay: the Secret mounted as a
file; ``ray job submit``: ``--runtime-env-json '{"env_vars": {"REWARD_SERVER_TOKEN_FILE":
"/path"}}'``), so the token itself is in no environment variable, job listing, or log line, only
the file's path is. ``$REWARD_SERVER_TOKEN`` (the value itself) still works and wins when both
are set, for a shell on one machine.

Every variable ``NAME`` that holds a token has its ``NAME_FILE`` (verl's ``token_env``
included): :func:`bearer_token` reads the value, else the file.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from reward_server.errors import ConfigError

logger = logging.getLogger(__name__)

TOKEN_ENV = "REWARD_SERVER_TOKEN"
FILE_SUFFIX = "_FILE"
TOKEN_FILE_ENV = TOKEN_ENV + FILE_SUFFIX
_warned: set[str] = set()  # files whose loose mode was logged (once per process each)


class TokenFileError(ConfigError, ValueError):
    """``$NAME_FILE`` names a file that cannot give a token (missing, unreadable, empty)."""


def bearer_token(name: str = TOKEN_ENV, *, environ: Mapping[str, str] | None = None) -> str | None:
    """The token in ``$name``, else the contents of the file ``$name_FILE`` (surrounding
    whitespace stripped); None when neither is set. A file that is named but gives no token
    raises :class:`TokenFileError` naming the variable, the path and the fix; a file of this
    user that others may read is logged once (with the ``chmod 600`` to run)."""
    env = os.environ if environ is None else environ
    value = env.get(name)
    if value:
        return value
    file_var = name + FILE_SUFFIX
    path = env.get(file_var)
    if not path:
        return None
    return read_token_file(Path(path), variable=file_var)


def read_token_file(path: Path, *, variable: str = TOKEN_FILE_ENV) -> str:
    """The token held by ``path`` (see :func:`bearer_token`)."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise TokenFileError(f"${variable}={path}: no such file; write the reward server's token "
                             f"there (umask 077; openssl rand -hex 32 > {path}) or point "
                             f"{variable} at the file that holds it") from None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise TokenFileError(f"${variable}={path}: cannot read it ({why}); give this user read "
                             "access (chmod 600, owned by the user that runs this process)") from None
    if not token:
        raise TokenFileError(f"${variable}={path}: the file is empty; write the reward server's "
                             "token into it")
    _warn_if_loose(path, variable=variable)
    return token


def _warn_if_loose(path: Path, *, variable: str) -> None:
    key = str(path)
    if key in _warned:
        return
    try:
        st = path.stat()
    except OSError:
        return
    # only a file of this user can be tightened by it (a Kubernetes Secret's file is root's)
    if st.st_mode & 0o077 and st.st_uid == os.getuid():
        _warned.add(key)
        logger.warning("$%s=%s is readable by other users (mode %s): chmod 600 %s", variable,
                       path, stat.filemode(st.st_mode), path)
