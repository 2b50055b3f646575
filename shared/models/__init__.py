"""Frozen pydantic models that travel on the wire (bus, annotations, REST)."""
