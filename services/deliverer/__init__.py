"""The webhook delivery service: lifecycle events in, signed HTTP deliveries out
(docs/webhooks.md)."""
