"""Dashboard widgets, one panel per module."""
