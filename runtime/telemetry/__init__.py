"""Process telemetry: the metric catalog (catalog.py), /metrics (endpoint.py), the
transports' samples (metrics.py), tracing (tracing.py) and a local span collector."""
