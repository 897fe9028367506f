"""verl.tools, as far as a tool file in a box needs it (see `verl/__init__.py`)."""
