"""Modal screens: knob input, confirmation, help."""
