"""code-interpreter-v1's R (IRkernel) and Java (torpor's JShell kernel) through the unmodified
``e2b-code-interpreter`` SDK against the real stack: values, state kept between cells, errors,
output streams, and hostile env var values and cwds (quotes, newlines, backslashes, javac's
\\uXXXX) that must come back as data, never run as code."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import TimeoutException
from e2b_code_interpreter import Sandbox

from bench.e2b_code_interpreter_suite import JAVA_KERNEL, R_KERNEL
from tests.conftest import skip_or_fail
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

HOSTILE = [
    'x"); System.exit(1); ("',
    "y\\u0022); System.exit(2); //",
    '")\nquit(save = "no")\n#',
    "tab\tand\nnewline\r\\ é😀 `id` $(id) '",
]


@pytest.fixture(scope="module")
def sbx(stack: Stack) -> Iterator[Sandbox]:
    for spec in (R_KERNEL, JAVA_KERNEL):
        if not spec.is_file():
            skip_or_fail(f"no {spec.parent.name} kernel spec at {spec}")
    s = Sandbox.create(timeout=600, envs={"SANDBOX_WIDE": "from-create"}, **stack.sdk_opts())
    yield s
    s.kill()


def test_the_sandboxs_env_vars_are_there_from_the_first_cell(sbx: Sandbox) -> None:
    java = sbx.create_code_context(language="java")
    assert sbx.run_code('System.getProperty("SANDBOX_WIDE")', context=java).text == "from-create"
    r = sbx.create_code_context(language="r")
    got = sbx.run_code('Sys.getenv("SANDBOX_WIDE")', context=r).results[0].text
    assert got == '[1] "from-create"'
    for ctx in (java, r):
        sbx.remove_code_context(ctx)


def test_r_values_state_and_errors(sbx: Sandbox) -> None:
    first = sbx.run_code("x <- 41\nx + 1", language="r")
    assert first.error is None
    assert first.results[0].text.strip() == "[1] 42"
    assert sbx.run_code("x", language="r").results[0].text.strip() == "[1] 41"  # state kept
    printed = sbx.run_code('print("Hello, World!")\nmessage("to stderr")', language="r")
    assert printed.logs.stdout == ['[1] "Hello, World!"\n']
    assert "to stderr" in "".join(printed.logs.stderr)
    failed = sbx.run_code('stop("boom")', language="r")
    assert failed.error is not None
    assert "boom" in failed.error.value
    assert sbx.run_code("undefined_thing", language="r").error is not None
    assert sbx.run_code("x * 2", language="r").results[0].text.strip() == "[1] 82"


def test_java_values_state_output_and_errors(sbx: Sandbox) -> None:
    assert sbx.run_code("int x = 41;", language="java").error is None
    assert sbx.run_code("x + 1", language="java").text == "42"
    sbx.run_code("import java.util.*;\nint twice(int a) { return 2 * a; }", language="java")
    assert sbx.run_code("twice(x)", language="java").text == "82"  # variables and methods kept
    assert sbx.run_code("new ArrayList<>(List.of(1, 2))", language="java").text == "[1, 2]"
    assert sbx.run_code('"a\\"b"', language="java").text == 'a"b'  # a String shows as its text
    out = sbx.run_code('System.out.println("Hello");\nSystem.err.print("E")', language="java")
    assert "".join(out.logs.stdout) == "Hello\n"
    assert out.logs.stdout[0] == "Hello"  # a line, then its newline, as IJava sends them
    assert out.logs.stderr == ["E"]
    bad = sbx.run_code('int y = "text";', language="java")
    assert bad.error is not None
    assert bad.error.name == "CompilationException"
    assert "incompatible types" in bad.error.value
    thrown = sbx.run_code('Integer.parseInt("zz")', language="java")
    assert thrown.error is not None
    assert thrown.error.name == "java.lang.NumberFormatException"
    assert thrown.error.value == 'For input string: "zz"'
    assert "Integer.parseInt" in thrown.error.traceback
    assert sbx.run_code("x", language="java").text == "41"  # errors keep the state


def test_java_exit_gives_an_error_and_a_fresh_jvm(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="java")
    sbx.run_code("int kept = 1;", context=ctx)
    gone = sbx.run_code("System.exit(3);", context=ctx)
    assert gone.error is not None and gone.error.name == "JVMExit"
    assert sbx.run_code("1 + 1", context=ctx).text == "2"
    assert sbx.run_code("kept", context=ctx).error is not None  # a new JVM: no state
    sbx.remove_code_context(ctx)


def test_a_client_timeout_interrupts_a_java_cell(sbx: Sandbox) -> None:
    ctx = sbx.create_code_context(language="java")
    sbx.run_code("int kept = 7;", context=ctx)
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) { }", context=ctx, timeout=3)
    started = time.monotonic()
    assert sbx.run_code("kept", context=ctx, timeout=30).text == "7"  # stopped, state kept
    assert time.monotonic() - started < 25
    sbx.remove_code_context(ctx)


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_values_stay_data_in_r_and_java(sbx: Sandbox, value: str) -> None:
    java = sbx.run_code('System.getProperty("V")', language="java", envs={"V": value})
    assert java.error is None, java.error
    assert java.text == value
    r = sbx.run_code('cat(Sys.getenv("V"))', language="r", envs={"V": value})
    assert r.error is None, r.error
    assert "".join(r.logs.stdout) == value
    # Restored after the execution; both kernels still answer.
    assert sbx.run_code('System.getProperty("V", "-")', language="java").text == "-"
    assert sbx.run_code('cat(Sys.getenv("V", unset = "-"))', language="r").logs.stdout == ["-"]


def test_r_env_names_that_are_r_syntax(sbx: Sandbox) -> None:
    code = 'cat(Sys.getenv("_A"), Sys.getenv("TRUE"))'
    r = sbx.run_code(code, language="r", envs={"_A": "1", "TRUE": "2"})
    assert r.error is None, r.error
    assert r.logs.stdout == ["1 2"]


def test_hostile_cwd_in_r_and_java(sbx: Sandbox) -> None:
    path = "/tmp/q\"uo'te\\d\nnl $(id) \\u0022"
    made = sbx.commands.run(f"mkdir -p {_sh(path)}", user="root")
    assert made.exit_code == 0
    r_ctx = sbx.create_code_context(language="r", cwd=path)
    assert "".join(sbx.run_code("cat(getwd())", context=r_ctx).logs.stdout) == path
    java_ctx = sbx.create_code_context(language="java", cwd=path)
    assert sbx.run_code('System.getProperty("user.dir")', context=java_ctx).text == path
    for ctx in (r_ctx, java_ctx):
        sbx.remove_code_context(ctx)


def _sh(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
