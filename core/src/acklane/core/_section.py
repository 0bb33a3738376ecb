"""The base of every YAML section's model: frozen, and closed to unknown fields.

It sits at the bottom of core's layers (docs/architecture.md) so that a section
modelled beside the code it configures (``tracing:`` in ``observe``) is one of the
configuration's sections without importing the configuration.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["SectionModel"]


class SectionModel(BaseModel):
    """A section of the YAML: a typo is a problem, never a silently ignored field."""

    model_config = ConfigDict(extra="forbid", frozen=True)
