"""torpor's Jupyter kernel for Java (spec ``java`` of code-interpreter-v1): an ipykernel
``Kernel`` that hands each cell to a long-lived JVM (TorporJShell, beside this file) running
JShell, so a cell's declarations stay for the next. Output of System.out/err streams as the cell
writes it (one stream message per write, as IJava sends it); an expression's value is the cell's
execute_result; compile errors and exceptions are error replies. An interrupt (SIGINT to the
kernel's process group, jupyter_client's default) stops the running cell in the JVM. A JVM that
exits (System.exit) ends that cell with an error; the next cell gets a fresh one."""

from __future__ import annotations

import json
import os
import re
import signal
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any

from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel

HERE = Path(__file__).resolve().parent
JAVA = "/usr/bin/java"
JVM_FLAGS = ("-XX:+UseSerialGC", "-Xshare:auto", "-Dfile.encoding=UTF-8")


class _Jvm:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [JAVA, *JVM_FLAGS, "-cp", str(HERE / "classes"), "TorporJShell"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # Its own session: only the interrupt this kernel forwards reaches it. SIGINT back to
            # its default (ipykernel ignores it), or the JVM cannot take it as a stop.
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
        )
        self.ready = False

    def read(self) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        while True:
            try:
                line = self.proc.stdout.readline()
            except KeyboardInterrupt:  # ipykernel's SIGINT handler during a request
                os.kill(self.proc.pid, signal.SIGINT)  # the JVM stops the cell and answers
                continue
            return json.loads(line) if line else None

    def run(self, code: str) -> None:
        assert self.proc.stdin is not None
        data = code.encode("utf-8", "surrogatepass")
        self.proc.stdin.write(struct.pack(">I", len(data)) + data)
        self.proc.stdin.flush()


class JavaKernel(Kernel):  # type: ignore[misc]
    implementation = "torpor-java"
    implementation_version = "1.0"
    language = "java"
    language_version = "17"
    language_info = {
        "name": "java",
        "version": "17",
        "mimetype": "text/x-java-source",
        "file_extension": ".java",
        "codemirror_mode": "text/x-java",
    }
    banner = "Java 17 (JShell), torpor"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._lock = threading.Lock()
        self._jvm = _Jvm()  # started now: the JVM takes a second or two to be ready

    def do_execute(
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
    ) -> dict[str, Any]:
        with self._lock:
            return self._execute(code, silent=silent)

    def _execute(self, code: str, *, silent: bool) -> dict[str, Any]:
        if self._jvm.proc.poll() is not None:
            self._jvm = _Jvm()
        try:
            if not self._jvm.ready:
                first = self._jvm.read()
                if first is None or not first.get("ready"):
                    return self._error(silent, "JVMError", "the JVM did not start", [])
                self._jvm.ready = True
            self._jvm.run(code)
            while True:
                msg = self._jvm.read()
                if msg is None:
                    code_ = self._jvm.proc.wait()
                    return self._error(silent, "JVMExit", f"the JVM exited ({code_})", [])
                if "out" in msg or "err" in msg:
                    if not silent:
                        name = "stdout" if "out" in msg else "stderr"
                        text = msg.get("out", msg.get("err", ""))
                        # A line and its newline as two messages, as IJava sends println.
                        for part in re.split(r"(\n)", text):
                            if part:
                                content = {"name": name, "text": part}
                                self.send_response(self.iopub_socket, "stream", content)
                    continue
                if msg.get("ename"):
                    return self._error(silent, msg["ename"], msg["evalue"] or "", msg["trace"])
                if msg.get("value") is not None and not silent:
                    content = {
                        "execution_count": self.execution_count,
                        "data": {"text/plain": msg["value"]},
                        "metadata": {},
                    }
                    self.send_response(self.iopub_socket, "execute_result", content)
                return self._ok()
        except (BrokenPipeError, ValueError) as e:
            self._jvm.proc.kill()
            return self._error(silent, "JVMError", f"lost the JVM: {e}", [])

    def _ok(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "execution_count": self.execution_count,
            "payload": [],
            "user_expressions": {},
        }

    def _error(self, silent: bool, ename: str, evalue: str, trace: list[str]) -> dict[str, Any]:
        content = {"ename": ename, "evalue": evalue, "traceback": trace or [f"{ename}: {evalue}"]}
        if not silent:
            self.send_response(self.iopub_socket, "error", content)
        return {"status": "error", "execution_count": self.execution_count, **content}

    def do_shutdown(self, restart: bool) -> dict[str, Any]:
        self._jvm.proc.kill()
        return {"status": "ok", "restart": restart}


if __name__ == "__main__":
    IPKernelApp.launch_instance(kernel_class=JavaKernel)
