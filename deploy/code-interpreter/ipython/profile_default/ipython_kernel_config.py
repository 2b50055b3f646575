# IPython kernel settings of code-interpreter-v1 (IPYTHONDIR=/opt/torpor/interpreter/ipython,
# set by the execution server for its kernels).
c = get_config()  # noqa: F821  (IPython's config loader defines it)
c.InteractiveShell.colors = "NoColor"  # tracebacks are text for the SDK, not a terminal
c.PlainTextFormatter.max_seq_length = 0  # whole lists in text/plain, as E2B shows them
