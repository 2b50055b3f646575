"""The operator dashboard served by the api at ``/dashboard`` (plain HTML + vanilla JS in
``static/``, live updates over server-sent events) and ``GET /api/v1/sandbox/{name}/events``."""

from services.api.dashboard.router import dashboard_router

__all__ = ["dashboard_router"]
