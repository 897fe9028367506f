"""The driver: the one entry point the CLI uses to run a job (`engine.runtime.driver.run`).

It resolves the model once, starts (or joins) Ray, creates the named RunController, the MessageQueue, the
rollout replicas, the Rollouter and the Trainer, runs both loops to the end, prints progress, and returns an
exit code: 0 only when the trainer finished its steps and no actor failed; 1 with a clear message naming the
failed actor otherwise; 130 on Ctrl-C. Every actor is killed on the way out, so no orphan processes remain.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

NAMESPACE = "asyncrl"


class RunFailed(RuntimeError):
    """A run-time failure with a message meant for the user."""


def prepare_run_dir(cfg: Any, resume: str | None) -> Path:
    """The run directory; an existing non-empty one is never overwritten (a timestamped sibling is used)."""
    run_dir = Path(cfg.logging.run_dir)
    if not resume and run_dir.exists() and any(run_dir.iterdir()):
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = run_dir.with_name(f"{run_dir.name}-{stamp}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def _placement(cfg: Any) -> dict[str, Any]:
    """How many replicas and trainer ranks, and what each actor asks Ray for."""
    from asyncrl_cli.config.hardware import load_hardware

    hw = load_hardware(cfg.resources.hardware)
    device = hw.device
    rollout_units = cfg.resources.rollout.nnodes * cfg.resources.rollout.gpus_per_node
    tp = cfg.rollout.tensor_parallel_size
    replicas = cfg.rollout.replicas or max(1, rollout_units // tp)
    if device == "cpu":
        cores = os.cpu_count() or 2
        sync = cfg.async_training.mode == "sync"
        return {"device": "cpu", "replicas": replicas, "replica_res": {"num_cpus": 1},
                "trainer_res": {"num_cpus": 1},
                # sync mode alternates phases, so each phase may use every core; async splits them
                "replica_threads": cores if sync else max(1, (cores // 2) // replicas),
                "trainer_threads": cores if sync else max(1, cores - cores // 2)}
    return {"device": device, "replicas": replicas, "replica_res": {"num_gpus": tp, "num_cpus": 1},
            "trainer_res": {"num_gpus": 1, "num_cpus": 1}, "replica_threads": 4, "trainer_threads": 4}


def _init_ray(address: str | None, placement: dict[str, Any]) -> bool:
    """Join `address` or start a local Ray. Returns True when this process started it."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return False
    quiet = not os.environ.get("ASYNCRL_DEBUG")
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=not quiet, logging_level="ERROR")
        return True
    cpus = max(os.cpu_count() or 2, 1 + placement["replicas"])
    ray.init(num_cpus=cpus, include_dashboard=False, namespace=NAMESPACE, log_to_driver=not quiet,
             logging_level="ERROR", object_store_memory=int(os.environ.get("ASYNCRL_OBJECT_STORE_BYTES", 1 << 30)))
    return True


def run(cfg: Any, *, provenance: dict | None = None, address: str | None = None, resume: str | None = None,
        tui: bool = False, progress: bool = True) -> int:
    """Run the job described by `cfg` to the end. Returns the process exit code."""
    try:
        return _run(cfg, provenance or {}, address, resume, tui, progress)
    except RunFailed as e:
        print(f"asyncrl: run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nasyncrl: interrupted; actors stopped.", file=sys.stderr)
        return 130


def _run(cfg: Any, provenance: dict, address: str | None, resume: str | None, tui: bool, progress: bool) -> int:
    from engine.models.loader import resolve_model_path

    run_dir = prepare_run_dir(cfg, resume)
    cfg_dict = json.loads(cfg.model_dump_json())
    cfg_dict["logging"]["run_dir"] = str(run_dir)
    (run_dir / "config.resolved.json").write_text(json.dumps(cfg_dict, indent=2))
    try:
        model_dir = str(resolve_model_path(cfg.model.path, seed=cfg.trainer.seed))
    except (FileNotFoundError, ValueError, ImportError) as e:
        raise RunFailed(str(e)) from None
    placement = _placement(cfg)
    started_ray = _init_ray(address, placement)
    try:
        return _run_actors(cfg, cfg_dict, provenance, run_dir, model_dir, placement, resume, tui, progress)
    finally:
        if started_ray:
            import ray

            ray.shutdown()


def _run_actors(cfg, cfg_dict, provenance, run_dir: Path, model_dir: str, placement, resume, tui, progress) -> int:
    import ray

    from asyncrl_cli.config.derived import max_queue_size, total_train_steps
    from engine.runtime.controller import create_run_controller, live_run_names
    from engine.runtime.queue import MessageQueue
    from engine.runtime.replica import RolloutReplica
    from engine.runtime.rollouter import Rollouter
    from engine.runtime.trainer_actor import Trainer
    from engine.telemetry.console import ConsoleProgress

    if cfg.name in live_run_names(NAMESPACE):
        raise RunFailed(f"a run named {cfg.name!r} is already live on this cluster; pick another `name`")
    total_steps = total_train_steps(cfg) * cfg.async_training.trigger_parameter_sync_step
    actors: list[Any] = []
    controller = create_run_controller(cfg.name, namespace=NAMESPACE, run_dir=str(run_dir), config=cfg_dict,
                                       provenance=provenance, total_steps=total_steps)
    actors.append(controller)
    console = ConsoleProgress(total_steps, enabled=progress and cfg.logging.progress and not tui)
    ok = False
    try:
        queue = MessageQueue.remote(max_queue_size(cfg))
        replicas = [RolloutReplica.options(**placement["replica_res"]).remote(
            cfg, model_dir, i, placement["replica_threads"]) for i in range(placement["replicas"])]
        actors += [queue, *replicas]
        _wait_ready([r.ready.remote() for r in replicas], "rollout replica")
        rollouter = Rollouter.remote(cfg, model_dir, queue, controller, replicas)
        trainer = Trainer.options(**placement["trainer_res"]).remote(
            cfg, model_dir, str(run_dir), queue, rollouter, controller, placement["trainer_threads"])
        actors += [rollouter, trainer]
        controller.record_event.remote({"time": time.time(), "kind": "start", "level": "info", "step": 0,
                                        "version": 0, "message": f"run {cfg.name} started in {run_dir}"})
        print(f"asyncrl: run {cfg.name!r} → {run_dir}  (attach: asyncrl attach {cfg.name})", file=sys.stderr)
        ok = _supervise(trainer, rollouter, controller, console, tui)
        return 0 if ok else 1
    finally:
        console.close()
        try:
            ray.get(controller.set_state.remote("finished" if ok else "failed"), timeout=10)
            ray.get(controller.close.remote(), timeout=10)
        except Exception:
            pass
        for a in reversed(actors):
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass


def _wait_ready(refs: list, what: str) -> None:
    import ray

    try:
        ray.get(refs)
    except ray.exceptions.RayActorError as e:
        raise RunFailed(f"{what} failed to start: {_root_cause(e)}") from None
    except ray.exceptions.RayTaskError as e:
        raise RunFailed(f"{what} failed to start: {_root_cause(e)}") from None


def _root_cause(e: BaseException) -> str:
    cause = getattr(e, "cause", None) or e
    text = str(cause).strip().splitlines()
    tail = [ln for ln in text if ln.strip()]
    return tail[-1] if tail else type(cause).__name__


def _supervise(trainer, rollouter, controller, console, tui: bool) -> bool:
    """Wait for both loops; poll the controller for the progress line. True iff the trainer finished cleanly."""
    import ray

    t_ref, r_ref = trainer.fit.remote(), rollouter.fit.remote()
    pending = {t_ref: "trainer", r_ref: "rollouter"}
    cursor = 0
    trainer_done = False
    if tui:
        _start_tui_thread(controller)
    while True:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
        snap = ray.get(controller.snapshot.remote(cursor))
        cursor = snap["cursor"]
        console.update(snap.get("metrics", []), snap.get("events", []))
        for ref in ready:
            name = pending.pop(ref)
            try:
                ray.get(ref)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                msg = f"{name} failed: {_root_cause(e)}"
                controller.record_event.remote({"time": time.time(), "kind": "error", "level": "error",
                                                "step": None, "version": None, "message": msg})
                raise RunFailed(msg) from None
            if name == "trainer":
                trainer_done = True
        if trainer_done and not pending:
            snap = ray.get(controller.snapshot.remote(cursor))
            console.update(snap.get("metrics", []), snap.get("events", []))
            return True
        if trainer_done and r_ref in pending:
            # the trainer stopped the rollouter; give its loop a moment to return
            try:
                ray.get(r_ref, timeout=30)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                raise RunFailed(f"rollouter failed: {_root_cause(e)}") from None
            pending.pop(r_ref, None)


def _start_tui_thread(controller) -> None:  # the dashboard in the launching terminal (`launch --tui`)
    import threading

    def _run() -> None:
        from asyncrl_cli.tui import run_dashboard
        from engine.runtime.control_client import ActorSource

        run_dashboard(ActorSource(controller))

    threading.Thread(target=_run, daemon=True).start()
