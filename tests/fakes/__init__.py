"""In-memory fakes of torpor's ports for the unit tier (``make unit``): no nats-server, no
subprocess. Each one keeps the semantics the real adapter gives callers (compare-and-set on a
revision, de-duplicated message ids, one pending timer per holder), never more.

Test code only: nothing under ``shared/`` or ``services/`` may import these.
"""
