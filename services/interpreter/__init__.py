"""The code-interpreter execution server: what E2B's Code Interpreter SDKs talk to on port 49999
inside a ``code-interpreter-v1`` sandbox (through torpor's proxy, like any port).

It runs in the sandbox on the template's own Python (``/opt/torpor/venv``, where jupyter_client
lives), never on the control plane, and imports no torpor code outside this package. Jupyter
kernels are its contexts: it starts them itself with jupyter_client (no Jupyter server in
between), one default context per language, and streams each execution as JSON lines
(``stdout``, ``stderr``, ``result``, ``error``, ``number_of_executions``, ``keepalive``,
``end_of_execution``), the wire format of E2B's ``template/server``. See
docs/e2b-compatibility.md, "Code Interpreter".
"""
