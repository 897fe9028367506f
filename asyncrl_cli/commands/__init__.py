"""One module per CLI verb; each exposes `command` (a function) or `app` (a Typer sub-app)."""
