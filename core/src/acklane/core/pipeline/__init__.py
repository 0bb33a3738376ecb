"""The pipeline a run assembles: the runner, watchers and their filters, the poison policy
and the attempt counts it reads."""
