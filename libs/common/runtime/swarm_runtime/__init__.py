"""What every Swarm service runs on: broker, intakes, KV records, object store, topology,
tracing, Prometheus metrics and settings. The SDK never imports it."""
