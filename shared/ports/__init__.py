"""Ports: what the application needs from the outside world, as narrow Protocols.

Adapters implement them (``shared/bus`` for NATS, ``shared/runtime/<name>`` for runtimes,
``shared/envd`` for the in-sandbox daemon); services and ``shared/lifecycle`` depend on these
Protocols only. Ports see the domain and nothing above it (``.importlinter``).
"""
