"""E2B's user model: who a request acts as.

The SDK names the user as the user name of HTTP Basic auth (``Authorization: Basic
base64("root:")``) on Connect calls, and as the ``username`` query parameter on ``/files``;
without one (SDK against envd >= 0.4.0) it is the default user, ``user``. Processes run as that
user (uid, gid, groups from the sandbox's ``/etc/passwd`` and ``/etc/group``) with ``HOME``,
``USER`` and ``LOGNAME`` set and its home as the default cwd; relative paths resolve against its
home; files and folders the daemon creates belong to it.

A daemon that cannot switch users (not root, e.g. an unprivileged container or a test on a
host) acts as itself for the default user and refuses any other; a daemon outside a sandbox
whose system has no ``user`` acts as itself for the default user too.
"""

from __future__ import annotations

import base64
import binascii
import os
import pwd
import re
from dataclasses import dataclass

DEFAULT_USER = "user"
_NAME_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}\$?")


class UnknownUser(ValueError):
    """The requested user does not exist here, is malformed, or cannot be acted as."""


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()

    @property
    def is_self(self) -> bool:
        return self.uid == os.geteuid()

    def env(self) -> dict[str, str]:
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}

    def own(self, path: str) -> None:
        """Give a file or folder the daemon created to this user (never following a symlink)."""
        if not self.is_self:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def own_new_dirs(self, path: str) -> None:
        """``os.makedirs(path)``, each folder it creates owned by this user."""
        missing = []
        current = path
        while current and not os.path.lexists(current):
            missing.append(current)
            parent = os.path.dirname(current)
            if parent == current:
                break
            current = parent
        for folder in reversed(missing):
            try:
                os.mkdir(folder)
            except FileExistsError:
                continue
            self.own(folder)


def basic_auth_user(authorization: str | None) -> str | None:
    """The user name of a ``Basic`` authorization header; ``None`` when there is none."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise UnknownUser("malformed Basic authorization header") from exc
    return decoded.partition(":")[0]


class Users:
    def __init__(self, *, fallback_home: str) -> None:
        self._fallback_home = fallback_home
        self._can_switch = os.geteuid() == 0

    def _self(self) -> Identity:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return Identity(name=name, uid=uid, gid=os.getegid(), home=self._fallback_home)

    def resolve(self, requested: str | None) -> Identity:
        """The identity a request acts as (``UnknownUser`` when it cannot be)."""
        name = requested or DEFAULT_USER
        if not _NAME_RE.fullmatch(name):
            raise UnknownUser(f"invalid user name {name[:40]!r}")
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            if not requested:
                return self._self()
            raise UnknownUser(f"user {name!r} does not exist in this sandbox") from None
        if not self._can_switch and entry.pw_uid != os.geteuid():
            if not requested:
                return self._self()
            raise UnknownUser(f"this daemon cannot act as {name!r} (it does not run as root)")
        groups = tuple(os.getgrouplist(name, entry.pw_gid))
        home = entry.pw_dir if os.path.isdir(entry.pw_dir) else self._fallback_home
        return Identity(name=name, uid=entry.pw_uid, gid=entry.pw_gid, home=home, groups=groups)
