"""What a sandbox's daemon reports about it: resource samples and log entries (``GET /metrics``
and ``GET /logs`` of ``services.envd``), as the control plane reads them."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class MetricSample(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    timestamp_unix: int = Field(ge=0)
    cpu_count: int = Field(ge=0)
    cpu_used_pct: float = Field(ge=0)
    mem_used: int = Field(ge=0)
    mem_total: int = Field(ge=0)
    disk_used: int = Field(ge=0)
    disk_total: int = Field(ge=0)


class LogEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    timestamp: datetime
    level: Literal["debug", "info", "warn", "error"]
    message: str
    fields: dict[str, str] = Field(default_factory=dict)
