"""The sandbox lifecycle as an application service: what the api, proxy and CLI call."""
