"""The pipeline a run assembles: the runner, watchers and their filters, and the poison
policy (its attempt counts are a table of the event store's database,
:mod:`acklane.core.events.attempts`)."""
