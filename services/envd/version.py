"""The envd protocol version this daemon implements (reported to the SDK as ``envdVersion``).

0.6.4: every SDK-gated feature up to it is served here: default user without Basic auth (0.4.0),
``CloseStdin`` (0.5.2), octet-stream uploads (0.5.7), file metadata as ``user.e2b.*`` xattrs
(0.6.2), the entry in watch events (0.6.3) and ``allow_network_mounts`` on watches (0.6.4).
"""

ENVD_VERSION = "0.6.4"
