"""NATS JetStream: subjects, topology, middleware and the adapters that talk to the server."""
