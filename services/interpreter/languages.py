"""The languages a context may have, their kernels, and the small snippets the server runs in a
kernel on the user's behalf (change directory, set and unset an environment variable).

Every value put into a snippet is quoted for that language here, and names are checked first:
the SDK's ``envs`` and ``cwd`` are user input, and a snippet must never become code the user did
not write (E2B's server pastes them into quotes as they are)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
MAX_ENV_VALUE = 128 * 1024


class BadRequest(ValueError):
    """Input the server refuses (the route answers 400 with the message)."""


@dataclass(frozen=True)
class Language:
    name: str  # what the SDK calls it (python, bash, javascript, ...)
    kernel: str  # the Jupyter kernel spec that runs it

    @property
    def late_outputs(self) -> bool:
        """Deno's kernel (javascript, typescript) may publish a cell's outputs after its idle
        status (``services.interpreter.execution.LATE_RESULT_GRACE``)."""
        return self.kernel == "javascript"

    def chdir(self, path: str) -> str:
        if self.name == "python":
            return f"import os as _torpor_os; _torpor_os.chdir({_py(path)}); del _torpor_os"
        if self.name == "bash":
            return f"cd {shlex.quote(path)}"
        if self.name in ("javascript", "typescript"):
            return f"process.chdir({json.dumps(path)})"
        if self.name == "r":
            return f"setwd({_r(path)})"
        if self.name == "java":  # as E2B's: the JVM's cwd stays, user.dir says where to be
            return f'System.setProperty("user.dir", {_java(path)});'
        return ""

    def set_env(self, env: dict[str, str]) -> str:
        return "\n".join(self._set(k, v) for k, v in env.items())

    def unset_env(self, names: list[str]) -> str:
        return "\n".join(self._unset(k) for k in names)

    def _set(self, key: str, value: str) -> str:
        if self.name == "python":
            return f"__import__('os').environ[{_py(key)}] = {_py(value)}"
        if self.name == "bash":
            return f"export {key}={shlex.quote(value)}"
        if self.name in ("javascript", "typescript"):
            return f"process.env[{json.dumps(key)}] = {json.dumps(value)};"
        if self.name == "r":  # a quoted name: `if`, `TRUE` or `_A` are names here, not syntax
            return f"Sys.setenv({_r(key)} = {_r(value)})"
        if self.name == "java":  # as E2B's: a system property (the JVM's environment is fixed)
            return f"System.setProperty({_java(key)}, {_java(value)});"
        return ""

    def _unset(self, key: str) -> str:
        if self.name == "python":
            return f"__import__('os').environ.pop({_py(key)}, None)"
        if self.name == "bash":
            return f"unset {key}"
        if self.name in ("javascript", "typescript"):
            return f"delete process.env[{json.dumps(key)}];"
        if self.name == "r":
            return f"Sys.unsetenv({_r(key)})"
        if self.name == "java":
            return f"System.clearProperty({_java(key)});"
        return ""


# SDK name -> kernel spec. typescript runs on the javascript kernel, as in E2B's template.
LANGUAGES = {
    "python": Language("python", "python3"),
    "bash": Language("bash", "bash"),
    "javascript": Language("javascript", "javascript"),
    "typescript": Language("typescript", "javascript"),
    "r": Language("r", "ir"),
    "java": Language("java", "java"),
}
ALIASES = {"js": "javascript", "ts": "typescript", "py": "python", "sh": "bash"}


def language(name: str | None) -> Language:
    """The language the SDK named (none: python); ``BadRequest`` for one this server has no
    kernel mapping for."""
    if name is None or not name.strip():
        return LANGUAGES["python"]
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    found = LANGUAGES.get(key)
    if found is None:
        shown = name[:60].encode("unicode_escape").decode()
        msg = f"unsupported language {shown!r} (one of: {', '.join(LANGUAGES)})"
        raise BadRequest(msg)
    return found


def check_env(env: object) -> dict[str, str]:
    """``env_vars`` of a request: a mapping of variable names to strings."""
    if env is None:
        return {}
    if not isinstance(env, dict):
        msg = "env_vars must be an object of strings"
        raise BadRequest(msg)
    checked: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_NAME.match(key):
            shown = str(key)[:60].encode("unicode_escape").decode()
            msg = f"invalid environment variable name {shown!r}"
            raise BadRequest(msg)
        if not isinstance(value, str) or "\0" in value or len(value) > MAX_ENV_VALUE:
            msg = f"environment variable {key}: the value must be a string without NUL bytes"
            raise BadRequest(msg)
        checked[key] = value
    return checked


def check_cwd(cwd: object) -> str:
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or len(cwd) > 4096:
        msg = "cwd must be an absolute path"
        raise BadRequest(msg)
    return cwd


def _py(text: str) -> str:
    return json.dumps(text)  # a JSON string (ASCII, escaped) is a valid Python literal


def _r(text: str) -> str:
    # R's double-quoted strings take JSON's escapes (\uXXXX too; NUL never gets here: check_env
    # and check_cwd refuse it). Other characters as they are (UTF-8, no escape for R to decode);
    # a lone surrogate has no UTF-8 form and stays an escape.
    quoted = json.dumps(text, ensure_ascii=False)
    return "".join(f"\\u{ord(c):04x}" if 0xD800 <= ord(c) <= 0xDFFF else c for c in quoted)


_JAVA_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _java(text: str) -> str:
    """A Java string literal of ``text``. Never a \\uXXXX escape for a character that means
    something in Java source: javac reads those before it parses (``\\u0022`` ends a literal),
    so quotes, backslashes and line ends get their own escapes, other control characters octal
    ones; surrogates alone (JSON allows them, UTF-8 cannot carry them) get \\uXXXX, which is safe
    for them."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _JAVA_ESCAPES:
            out.append(_JAVA_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\{code:03o}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
