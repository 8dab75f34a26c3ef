"""Where the daemon's and the agents' secrets come from, and the check that keeps them out of a
config file that other users can read.

Every user's CLI may read the config file (for the socket path), so on most installations it
is world-readable. A database password in it is a root shell for anyone who reads it: the
daemon's database role can set any job's owner and command, and the daemon runs what the
store says as that owner (issue 48). A provider token or password in it is a stolen account.
So a secret comes from a root-only file named by a `*_file` key (`db_file`,
`[carbon] electricitymaps_token_file`, `[carbon] watttime_password_file`) or from a systemd
credential (`LoadCredential=NAME:PATH`, read from `$CREDENTIALS_DIRECTORY/NAME`;
`systemd/credentials.conf`), and a config that other users can read and that holds one
inline is refused by `config check`, the daemon and the agents, naming the key.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: systemd credential names the daemon and the agents read; each is also a config key that
#: holds the secret inline (`db`, `[carbon] electricitymaps_token`, ...) and has a `*_file` twin.
CREDENTIALS = ("db", "electricitymaps_token", "watttime_password")
#: the secrets a config file may hold inline, by table ("" is the top level) and key
INLINE_SECRETS = (("", "db"), ("carbon", "electricitymaps_token"), ("carbon", "watttime_password"))


def others_can_read(mode: int) -> bool:
    """Whether a file of this mode is readable by users besides its owner (group or world)."""
    return bool(mode & (stat.S_IRGRP | stat.S_IROTH))


def read_secret(path: Path | str) -> str:
    """The secret held in `path` (surrounding white space and the final newline dropped).

    ValueError, one line without the secret, when the file is missing, unreadable, empty or
    readable by other users (a secret there is no better than one in the shared config).
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode
            text = f.read()
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except PermissionError:
        raise ValueError(f"{path} is not readable by uid {os.geteuid()} (run as the daemon's user, root)") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text") from None
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    if others_can_read(mode):
        raise ValueError(f"{path} is readable by other users (mode {stat.S_IMODE(mode):04o}): chmod 600 {path}")
    value = text.strip()
    if not value:
        raise ValueError(f"{path} is empty")
    return value


def credential_path(name: str, environ: Mapping[str, str] | None = None) -> Path | None:
    """The systemd credential `name` given to this service ($CREDENTIALS_DIRECTORY/NAME), if any."""
    environ = os.environ if environ is None else environ
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return None
    path = Path(directory) / name
    return path if path.exists() else None


def read_credential(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The systemd credential `name`, or None without one. systemd makes the credentials
    directory private to the service, so its files' modes are not checked."""
    path = credential_path(name, environ)
    if path is None:
        return None
    try:
        value = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"systemd credential `{name}` ({path}) cannot be read: {e}") from None
    if not value:
        raise ValueError(f"systemd credential `{name}` ({path}) is empty")
    return value


def db_url_has_password(url: str) -> bool:
    """Whether a database URL carries a password (in its user part or as `?password=`)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return False
    return bool(parsed.password) or "password" in parsed.query


def hide_password(url: str) -> str:
    """A database URL as it may be shown: its password as `***`."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": "***"})
    return parsed.render_as_string(hide_password=True)


def exposed_secrets(config: Mapping[str, Any], config_path: str | None) -> list[str]:
    """One error per secret held inline in a config file that other users can read."""
    if not config_path:
        return []
    try:
        mode = os.stat(config_path).st_mode
    except OSError:
        return []  # no file (a test's mapping): nothing is exposed
    if not others_can_read(mode):
        return []
    errors = []
    for table, key in INLINE_SECRETS:
        section = config.get(table, {}) if table else config
        value = section.get(key) if isinstance(section, Mapping) else None
        if not isinstance(value, str) or not value.strip():
            continue
        if key == "db" and not db_url_has_password(value):
            continue
        where = f"[{table}] `{key}`" if table else f"config key `{key}`"
        what = "a database password (whoever reads it can change any job, run as root)" if key == "db" \
            else "a secret"
        errors.append(f"{config_path}: {where} holds {what} inline and other users can read this file "
                      f"(mode {stat.S_IMODE(mode):04o}): move it to a root-only file named by `{key}_file` "
                      f"or to the systemd credential `{key}` (systemd/credentials.conf), or chmod 600 the file")
    return errors
