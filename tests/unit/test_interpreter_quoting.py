"""The R and Java snippets of services/interpreter/languages.py keep hostile env var values and
cwds as data: each is read back here the way the language's own parser reads it (Java: the
\\uXXXX pre-pass javac runs before it tokenizes, then the string literal; R: its escapes), and
must be one literal that ends where the snippet's syntax says and holds the input unchanged.
tests/e2b_sdk/test_code_interpreter.py sends the same values through the real kernels."""

from __future__ import annotations

import json
import re

import pytest

from services.interpreter.languages import LANGUAGES

pytestmark = pytest.mark.unit

HOSTILE = [
    'a"); System.exit(1); ("',
    "x\\u0022); System.exit(1); //",  # javac would read \u0022 as a quote before parsing
    "\\\\u0022",
    "line\nbreak\r\n",
    "tab\tctl\x01\x1f\x7f",
    "a\\",
    '")\nSys.setenv(X = "pwned")\n#',
    "`backtick` $(id) '; q()",
    "ünïcödé € 😀 \u2028\u2029",
    "\ud800 lone",
    "",
]


def _java_unicode_prepass(src: str) -> str:
    """JLS 3.3: \\uXXXX (after an even run of backslashes) becomes its character first."""
    out, i = [], 0
    while i < len(src):
        if src[i] == "\\":
            run = len(src[i:]) - len(src[i:].lstrip("\\"))
            if run % 2 == 1 and re.match(r"\\u+[0-9a-fA-F]{4}", src[i + run - 1 :]):
                out.append("\\" * (run - 1))
                m = re.match(r"\\u+([0-9a-fA-F]{4})", src[i + run - 1 :])
                assert m is not None
                out.append(chr(int(m.group(1), 16)))
                i += run - 1 + m.end()
                continue
            out.append("\\" * run)
            i += run
            continue
        out.append(src[i])
        i += 1
    return "".join(out)


_JAVA_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "b": "\b", "f": "\f", "s": " ", '"': '"'}


def _java_literal(src: str, start: int) -> tuple[str, int]:
    """The value of the Java string literal at ``src[start]`` and the index after it."""
    assert src[start] == '"'
    out, i = [], start + 1
    while src[i] != '"':
        c = src[i]
        assert c not in "\r\n", "a raw line end inside a Java string literal"
        if c == "\\":
            e = src[i + 1]
            if e in "01234567":
                m = re.match(r"[0-3][0-7]{0,2}|[4-7][0-7]?", src[i + 1 :])
                assert m is not None
                out.append(chr(int(m.group(0), 8)))
                i += 1 + m.end()
                continue
            out.append({**_JAVA_SIMPLE, "'": "'", "\\": "\\"}[e])
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out), i + 1


def _r_literal(src: str, start: int) -> tuple[str, int]:
    """The value of the R double-quoted literal at ``src[start]`` (the escapes the snippets use:
    JSON's) and the index after it."""
    assert src[start] == '"'
    i = start + 1
    while src[i] != '"':
        i += 2 if src[i] == "\\" else 1
    literal = src[start : i + 1]
    assert "\n" not in literal and "\r" not in literal
    return json.loads(literal), i + 1


@pytest.mark.parametrize("value", HOSTILE)
def test_java_set_env_and_chdir_keep_the_value_as_one_literal(value: str) -> None:
    java = LANGUAGES["java"]
    src = _java_unicode_prepass(java.set_env({"NAME": value}))
    assert src.startswith('System.setProperty("NAME", ')
    got, end = _java_literal(src, len('System.setProperty("NAME", '))
    assert got == value
    assert src[end:] == ");"
    src = _java_unicode_prepass(java.chdir("/tmp/" + value))
    got, end = _java_literal(src, len('System.setProperty("user.dir", '))
    assert got == "/tmp/" + value
    assert src[end:] == ");"
    assert java.unset_env(["NAME"]) == 'System.clearProperty("NAME");'


@pytest.mark.parametrize("value", HOSTILE)
def test_r_set_env_and_chdir_keep_the_value_as_one_literal(value: str) -> None:
    r = LANGUAGES["r"]
    src = r.set_env({"NAME": value})
    assert src.startswith('Sys.setenv("NAME" = ')
    got, end = _r_literal(src, len('Sys.setenv("NAME" = '))
    assert got == value
    assert src[end:] == ")"
    src = r.chdir("/tmp/" + value)
    got, end = _r_literal(src, len("setwd("))
    assert got == "/tmp/" + value
    assert src[end:] == ")"


def test_r_names_that_are_r_syntax_are_quoted() -> None:
    # `if`, `TRUE` and `_A` pass the name check but are no R symbols: a quoted argument name is.
    r = LANGUAGES["r"]
    assert r.set_env({"if": "1", "_A": "2"}) == 'Sys.setenv("if" = "1")\nSys.setenv("_A" = "2")'
    assert r.unset_env(["TRUE"]) == 'Sys.unsetenv("TRUE")'


def test_several_values_are_one_statement_each() -> None:
    src = LANGUAGES["java"].set_env({"A": "1\n2", "B": "x"})
    assert src.splitlines() == [
        'System.setProperty("A", "1\\n2");',
        'System.setProperty("B", "x");',
    ]
