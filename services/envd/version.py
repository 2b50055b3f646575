"""The envd protocol version this daemon implements (reported to the SDK as ``envdVersion``).

0.5.7 is the highest version whose SDK-gated features are all served here: default user without
Basic auth (0.4.0), ``CloseStdin`` (0.5.2) and octet-stream uploads (0.5.7). 0.6.2 would promise
file metadata (``X-Metadata-*`` persisted per file), which this daemon does not store.
"""

ENVD_VERSION = "0.5.7"
