"""What every test folder and ``bench/`` use to run torpor for real: one ``Stack`` (the services
as processes, or ``torpor up``), API keys, the host's view of pods and service processes, a clean
environment, and uvicorn on a loopback port. Nothing here is imported by ``shared`` or
``services``."""
