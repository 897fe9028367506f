"""Hardware presets (`presets/hardware/*.toml`): one kind of node, described once.

The model and the loader live in `engine.plan.hardware` (the engine reads a preset's device, and must not
import the CLI package); this module keeps the CLI's names.
"""

from __future__ import annotations

from engine.plan.hardware import (
    HardwareInvalid,
    HardwareNotFound,
    HardwarePreset,
    hardware_names,
    hardware_path,
    load_hardware,
)

__all__ = ["HardwareInvalid", "HardwareNotFound", "HardwarePreset", "hardware_names", "hardware_path", "load_hardware"]
