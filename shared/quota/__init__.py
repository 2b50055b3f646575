"""Per-user quotas (sandboxes held, sandboxes running) and rate limits (creates, resumes)."""
