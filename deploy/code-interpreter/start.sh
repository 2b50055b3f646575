#!/bin/bash
# code-interpreter-v1's start command (/opt/torpor/interpreter/start): the execution server,
# started again half a second after it exits or is killed (E2B's template has systemd do this).
# Its kernels die with it (the server starts them under setpriv --pdeathsig KILL).
export PYTHONPATH=/opt/torpor/interpreter
while :; do
  /opt/torpor/venv/bin/python -m services.interpreter --listen 0.0.0.0:49999 --home /home/user \
    --languages python,javascript
  echo "interpreter: the server exited ($?); starting it again" >&2
  sleep 0.5
done
