"""The run plan's formulas, shared by the CLI and the engine: pure Python (pydantic for the hardware preset model),
no torch, no ray — importing it costs what the CLI's `validate` already pays.

    run_plan.py   `RunPlan` and `resolve_plan`: the validated config with everything below resolved once
    sizes.py      required_samples, max_required_samples, max_queue_size, total_*_steps, the `Derived` table,
                  M = trainer_world, rollout_world, the replica count R, the trainer's data-parallel size
    hardware.py   hardware presets (`presets/hardware/*.toml`): the model, the loader, a preset's device
    devices.py    a `RoleDevice` per role (device type, index policy, collective env; device → backend tables)
    presets.py    where the preset catalog lives (env path, source tree, or the installed package's data)
    layout.py     the pools' layout over nodes · placement.py: the dry-run placement and each actor's Ray options
    memory.py     the memory model per trainer rank and replica (its fitted coefficients: `_calibration/`)
    auto.py       "auto" precision / cpu_threads: the shapes to time and the decision from the times (the launch
                  measures: `engine.launch.probe`) · machine.py: CPU model and bf16 ISA flags (/proc/cpuinfo)

`asyncrl plan`, the prediction of a layout's speed, is a client of these: `engine.predict`.

The CLI's config package imports these; the engine never imports the CLI package (`make lint` enforces it),
so every formula is written once, here, below both.
"""
