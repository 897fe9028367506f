"""`Section`: the base of every run-config table (pydantic v2): unknown keys are errors, attribute docstrings
are descriptions (the JSON Schema's and the CLI help's). Pure Python + pydantic."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every table: unknown keys are errors, docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True,
                              allow_inf_nan=False)
