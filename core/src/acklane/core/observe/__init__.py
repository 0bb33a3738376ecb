"""Observability: health probes, Prometheus metrics, progress lines, log set-up and the one
redaction that keeps secrets out of every output."""
