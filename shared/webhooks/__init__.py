"""Webhook rules every part shares (the api registers, the deliverer delivers): signatures,
backoff, and which URLs and addresses a delivery may reach. Pure: no bus, no HTTP client."""
