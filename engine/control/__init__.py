"""The control plane: the one entry of the CLI and the dashboard into the engine besides the driver.

- `knob_table` the knob table (`KNOBS`: kind, range, owner, followers, boundary, refusal, preview, paths, key)
- `knobs`      validation and parsing against the knob table (`KNOBS`, also `KNOB_SPECS`),
               each knob's state in the controller, the values a resume starts from
- `core`       `ControllerCore`: metric/event ring buffers with a cursor, the worker table, versioned knobs
- `controller` `RunController`, the Ray actor around the core; run namespaces and discovery on a cluster
- `registry`   the per-user registry of live runs on this machine (run ids, claim/release, matching)
- `client`     the sources a dashboard or `asyncrl ctl` reads: `ControlClient`, `ActorSource`, `LocalSource`,
               `ReadOnlySource`, `ReplaySource` (`replay`: a run directory served as a controller)
- `errors`     the typed errors the control plane raises; the CLI maps them to exit codes

Nothing here imports torch; Ray is imported only inside the functions that talk to a cluster. Import the
submodules (this package's `__init__` imports nothing, so `engine.control.knobs` stays cheap).
"""
