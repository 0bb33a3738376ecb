"""Observability: health probes, Prometheus metrics, progress lines and log set-up.

The one redaction that keeps secrets out of every output is :mod:`acklane.core.redact`
(also importable as ``acklane.core.observe.redact``): the layers below this one use it.
"""
