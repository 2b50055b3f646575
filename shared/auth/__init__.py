"""Users and API keys: keys are random secrets shown once and stored only as sha256 hashes.

Pure logic over a narrow ``Bucket`` port; the NATS KV adapter is ``shared.bus.kv.NatsBucket``.
"""
