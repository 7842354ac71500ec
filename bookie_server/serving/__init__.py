"""The bookie's serving shell: gRPC service, add/read lane, listeners, registration,
health, admin HTTP, TLS, metrics."""
