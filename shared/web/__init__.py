"""HTTP serving shared by the api and the proxy: connection-level limits (uvicorn protocol),
request-level limits (ASGI), and the trusted-proxy rule."""
