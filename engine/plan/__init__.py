"""The run plan's formulas, shared by the CLI and the engine: pure Python (pydantic for the hardware preset model),
no torch, no ray — importing it costs what the CLI's `validate` already pays.

    sizes.py      required_samples, max_required_samples, max_queue_size, total_*_steps, the `Derived` table,
                  M = trainer_world, rollout_world, the replica count R, the trainer's data-parallel size
    hardware.py   hardware presets (`presets/hardware/*.toml`): the model, the loader, a preset's device
    presets.py    where the preset catalog lives (env path, source tree, or the installed package's data)
    placement.py  the placement: the dry-run layout over nodes and the Ray options each actor asks for
    auto.py       "auto" precision / cpu_threads: the shapes to time and the decision from the times (the launch
                  measures: `engine.runtime.probe`) · machine.py: CPU model and bf16 ISA flags (/proc/cpuinfo)

and `asyncrl plan`, the prediction of a layout's speed with the loop simulator:

    costs.py      the cost model (calibration file, else FLOP/bandwidth estimates from config.json + hardware)
    calibrate.py  a calibration file from a real run's metrics.jsonl
    predict.py    one prediction (async, sync and colocated on the same accelerators) · sweep.py: a grid of them

The CLI's config package imports these; the engine never imports the CLI package (`make lint` enforces it),
so every formula is written once, here, below both.
"""
