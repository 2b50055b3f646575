"""The rules for user values that reach a command line, a runtime or a pod: environment
variables, metadata and template names. One place for each rule, used by the E2B and native
routes (as pydantic types, so a violation is a 400/422 naming the field) and by anything else
that accepts such values.

Why these rules: env keys and values end up in a pod's environment (bubblewrap ``--setenv``,
a Kubernetes container's ``env``); an option-looking key (``--ro-bind``), a key holding ``=``
or a NUL byte anywhere can change how that is parsed. Sizes are bounded because every value is
stored in the KV record and carried on the bus. Error messages name keys (truncated) but never
echo values: an env value may be a secret.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

ENV_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
_ENV_KEY_RE = re.compile(ENV_KEY_PATTERN)
MAX_ENV_VARS = 128
MAX_ENV_KEY = 256
MAX_ENV_VALUE = 32 * 1024
MAX_ENV_TOTAL = 256 * 1024

MAX_METADATA = 64
MAX_METADATA_KEY = 256
MAX_METADATA_VALUE = 4096
MAX_METADATA_TOTAL = 64 * 1024

TEMPLATE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$"
_TEMPLATE_RE = re.compile(TEMPLATE_NAME_PATTERN)
# Control characters (C0 and DEL): never meaningful in a metadata key or value.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _shown(key: str) -> str:
    return repr(key[:40] + ("…" if len(key) > 40 else ""))


@dataclass(frozen=True)
class _Pairs:
    """The rule env vars and metadata share: at most ``most`` pairs, no empty key, each pair's
    own checks (``check``'s ``problem``: the message, or None), at most ``total`` characters of
    keys and values. The words name them in the messages."""

    most: int
    total: int
    entries: str  # "at most {most} {entries} are allowed"
    key: str  # "a {key} must not be empty"
    take: str  # "{take} more than {total} characters in total"

    def check(self, pairs: dict[str, str], problem: Callable[[str, str], str | None]) -> None:
        if len(pairs) > self.most:
            msg = f"at most {self.most} {self.entries} are allowed"
            raise ValueError(msg)
        total = 0
        for key, value in pairs.items():
            if not key:
                msg = f"a {self.key} must not be empty"
                raise ValueError(msg)
            if (bad := problem(key, value)) is not None:
                raise ValueError(bad)
            total += len(key) + len(value)
        if total > self.total:
            msg = f"{self.take} more than {self.total} characters in total"
            raise ValueError(msg)


_ENVS = _Pairs(MAX_ENV_VARS, MAX_ENV_TOTAL, "variables", "variable name", "the variables take")
_METADATA = _Pairs(
    MAX_METADATA, MAX_METADATA_TOTAL, "entries", "metadata key", "the metadata takes"
)


def _env_problem(key: str, value: str) -> str | None:
    if len(key) > MAX_ENV_KEY or not _ENV_KEY_RE.match(key):
        return (
            f"variable name {_shown(key)} is invalid: use letters, digits and '_', "
            f"not starting with a digit, at most {MAX_ENV_KEY} characters"
        )
    if "\0" in value:
        return f"the value of {_shown(key)} contains a NUL byte"
    if len(value) > MAX_ENV_VALUE:
        return f"the value of {_shown(key)} is longer than {MAX_ENV_VALUE} characters"
    return None


def check_envs(envs: dict[str, str]) -> dict[str, str]:
    """Environment variables for a sandbox's processes; ``ValueError`` names the bad key."""
    _ENVS.check(envs, _env_problem)
    return envs


def _metadata_problem(key: str, value: str) -> str | None:
    if len(key) > MAX_METADATA_KEY or _CONTROL.search(key):
        return (
            f"metadata key {_shown(key)} is invalid: at most {MAX_METADATA_KEY} characters, "
            "no control characters"
        )
    if len(value) > MAX_METADATA_VALUE or _CONTROL.search(value):
        return (
            f"the value of {_shown(key)} is invalid: at most {MAX_METADATA_VALUE} "
            "characters, no control characters"
        )
    return None


def check_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """User metadata (shown back, used as a list filter); ``ValueError`` names the bad key."""
    _METADATA.check(metadata, _metadata_problem)
    return metadata


def check_template_name(name: str) -> str:
    if not _TEMPLATE_RE.match(name):
        msg = (
            f"template {_shown(name)} is invalid: lowercase letters, digits, '.', '_' and '-', "
            "at most 63 characters"
        )
        raise ValueError(msg)
    return name


# What a create names: a template, or a user's template ``name:tag`` (E2B's tags).
_TEMPLATE_REF_RE = re.compile(TEMPLATE_NAME_PATTERN[:-1] + r"(:[A-Za-z0-9][A-Za-z0-9_.-]{0,62})?$")


def check_template_ref(ref: str) -> str:
    if not _TEMPLATE_REF_RE.match(ref):
        msg = (
            f"template {_shown(ref)} is invalid: lowercase letters, digits, '.', '_' and '-', "
            "at most 63 characters, optionally ':' and a tag"
        )
        raise ValueError(msg)
    return ref


EnvVars = Annotated[dict[str, str], AfterValidator(check_envs)]
Metadata = Annotated[dict[str, str], AfterValidator(check_metadata)]
TemplateName = Annotated[str, AfterValidator(check_template_name)]
TemplateRef = Annotated[str, AfterValidator(check_template_ref)]
