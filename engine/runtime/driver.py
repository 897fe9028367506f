"""The driver: the one entry point the CLI uses to run a job, `engine.runtime.driver.run(plan)` of a `RunPlan`
(`engine.plan.run_plan`: config, sizes with M and R, hardware preset, placement, the actors' Ray resources).

It claims a run id in the per-user registry of live runs (`engine.control.registry`: a second live run of one name on
this machine is refused unless `allow_same_name`), checks the model and the data (`engine.launch.preflight`,
before the run directory is touched or Ray starts), picks the checkpoint to continue from with `--resume`
(`engine.persist.resume`), starts Ray, creates the named RunController, the MessageQueue, the rollout replicas, the
Rollouter and the Trainer (on resume the trainer restores its checkpoint and pushes the weights to the
replicas before generation starts), runs both loops to the end, prints progress, and returns an exit code:

* 0 when the trainer finished its steps, or stopped gracefully on request (with a checkpoint);
* 1 with one line naming the cause otherwise: bad input found by the preflight, a cluster without the GPUs
  the run needs (checked right after Ray starts, instead of waiting forever), placement groups not placed
  within `resources.placement_timeout_s` (`placement_groups.py`), a failed actor, the replica restart budget
  spent (after a checkpoint); the line names the checkpoint and the command that resumes it;
* 130 on Ctrl-C, SIGTERM or SIGHUP (`stop_signals`; SIGHUP is left ignored under `nohup`), after asking the
  trainer for a stop checkpoint — within `resources.stop_grace_s` when set, the full one if it fits, else a light
  one (`engine.persist.stop_grace`) — recording a `stop` event and printing the resume command (a second
  signal abandons it).

The stop path never depends on the terminal: stdout and stderr go through `terminal.GuardedStream`, which turns
EPIPE (`| tee` gone after Ctrl-C), EIO (a closed terminal), ENOSPC / EFBIG (a full disk) and EBADF (`>&-`) into
writing `<run dir>/run.log`; the driver's own lines (the stop, the resume command) are always copied there.

Every actor is killed on the way out, so no orphan processes remain, and the registry entry is removed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.control.controller import NAMESPACE
from engine.plan.rollout_replica import fp8_refusal, replica_nodes
from engine.plan.run_plan import RunPlan
from engine.runtime.launch_context import ActorPlacement, LaunchContext, LaunchOptions, Resumed, StopContext
from engine.runtime.placement_groups import PlacementTimeout, reserve_run
from engine.runtime import terminal
from engine.runtime.ray_start import (RunFailed, StartRefused, check_capacity, init_ray, object_store_bytes,
                                      snapshot_ray_env, weight_bytes)
from engine.launch.probe import resolve_auto
from engine.persist.run_dirs import prepare_run_dir
from engine.persist.stop_grace import stop_grace_s
from engine.runtime.stop_signals import StopSignals, children_ignore_hangup
from engine.runtime.terminal import say
from engine.runtime.stopping import report_stop, stop_with_checkpoint
from engine.telemetry.events import run_event
from engine.telemetry.sinks import CONFIG_FILE, MACHINE_FILE, PLAN_FILE, PROVENANCE_FILE

if TYPE_CHECKING:
    from engine.config.schema import RunConfig
    from engine.control.registry import RunEntry


def trainer_ranks(plan: RunPlan) -> int:
    """M, the plan's trainer ranks. Raises RunFailed for a Megatron layout the backend cannot run on the run's
    device: context parallelism (cp > 1) on CPU (it needs Transformer Engine's attention, which needs CUDA)."""
    t = plan.config.trainer
    if t.backend == "megatron" and t.cp > 1 and plan.device == "cpu":
        raise RunFailed(f"trainer.cp = {t.cp}: context parallelism needs Transformer Engine's attention "
                        "(megatron-core's local attention runs cp = 1 only) and Transformer Engine needs CUDA; "
                        "on CPU set trainer.cp = 1")
    return plan.trainer_ranks


def _placement(plan: RunPlan) -> dict[str, Any]:
    """A copy of the plan's actor resources for the driver to add to; on accelerators also the plan's pools (the layout
    `launch --dry-run` shows: which node and bundles each actor takes), on CPU hardware the nodes of a replica that
    spans several (`replica_nodes`). Refuses a layout or a replica it cannot run (`RunPlan.layout_error`)."""
    trainer_ranks(plan)
    placement = copy.deepcopy(plan.actors)
    refusal = fp8_refusal(placement["device"]) if plan.config.rollout.quantization == "fp8" else None
    if refusal:  # on every device: a CPU replica would fail inside vLLM at start-up
        raise RunFailed(refusal)
    placement["placement_timeout_s"] = plan.config.resources.placement_timeout_s
    if plan.layout_error:  # on CPU hardware (no pools) only what the runtime does not build (`run_plan.not_built`)
        raise RunFailed(plan.layout_error)
    if placement["device"] != "cpu":
        placement["layouts"] = plan.placement.pools
        return placement
    nodes = replica_nodes(plan.config, plan.config.resources.rollout.gpus_per_node)
    if nodes > 1:  # one placement group per replica over `nodes` nodes (`placement_groups.reserve_spanning`)
        placement["replica_nodes"] = nodes
    return placement


def run(plan: RunPlan, *, provenance: dict | None = None, address: str | None = None,
        resume: str | None = None, tui: Callable[[Any, Callable[[], bool]], bool] | None = None,
        progress: bool = True, allow_same_name: bool = False, command: list[str] | None = None,
        prediction: dict | None = None, insecure: bool = False) -> int:
    """Run the job `plan` describes to the end (`engine.plan.run_plan.resolve_plan`: the CLI, tests and benchmarks
    resolve the plan first). Returns the exit code.

    `tui`: the dashboard runner for `launch --tui`, `tui(metrics_source, work) -> work()`; the CLI passes it in
    (its dashboard lives in the CLI package, which the engine does not import). `command` is the launch as the
    user typed it (without `--resume`); the resume hint appends `--resume <run dir>` to it. `prediction`: the plan's
    expectation (`launch --plan`), written to `<run dir>/plan.json` and shown by the dashboard. `insecure`
    (`launch --insecure`): run on a Ray without token auth (`engine.runtime.ray_start`), with a warning event."""
    from engine.launch.preflight import PreflightError
    from engine.persist.resume import ResumeError
    from engine.control.registry import NameInUse, claim, release

    if not isinstance(plan, RunPlan):
        raise TypeError(f"run() takes a RunPlan (engine.plan.run_plan.resolve_plan), not {type(plan).__name__}")
    terminal.install()  # from here on no write to stdout / stderr can raise
    try:
        entry = claim(plan.config.name, allow_same_name=allow_same_name)
    except NameInUse as e:
        say(f"asyncrl: cannot start: {e}")
        return 1
    except OSError as e:
        say(f"asyncrl: cannot start: cannot write the registry of live runs ({e}); set ASYNCRL_STATE_DIR to a "
            "writable directory")
        return 1
    options = LaunchOptions(command, allow_same_name, prediction, insecure, progress)
    try:
        return _run(plan, provenance or plan.provenance, address, resume, tui, entry, options)
    except (PreflightError, ResumeError) as e:
        say(f"asyncrl: cannot start: {e}")
        return 1
    except StartRefused as e:
        say(f"asyncrl: cannot start: {e}")
        return 1
    except RunFailed as e:
        say(f"asyncrl: run failed: {e}")
        return 1
    except KeyboardInterrupt:
        say("\nasyncrl: interrupted; actors stopped.")
        return 130
    finally:
        release(entry)


TuiRunner = Callable[[Any, Callable[[], bool]], bool]
"""`launch --tui`'s dashboard runner: `tui(metrics_source, work) -> work()` (see `run`)."""


def _run(plan: RunPlan, provenance: dict, address: str | None, resume: str | None, tui: TuiRunner | None,
         entry: RunEntry, options: LaunchOptions) -> int:
    """Prepare the launch (model, "auto" settings, run directory, resume point, Ray, placement) into one
    `LaunchContext`, then start and supervise the actors (`_run_actors`)."""
    from engine.control import registry
    from engine.control.controller import run_namespace
    from engine.launch.preflight import preflight
    from engine.persist.resume import ResumeError, find_resume_point, resume_message, rewind_run_dir

    _placement(plan)  # a layout this runtime cannot run is refused before anything starts
    model_dir = preflight(plan.config)  # nothing is written before the inputs are known to be usable
    plan, machine = resolve_auto(plan, model_dir)  # "auto" precision / threads: measured here, one line each
    cfg = plan.config
    placement = _placement(plan)
    point = find_resume_point(cfg, resume) if resume else None
    for path, why in point.skipped if point else []:
        say(f"asyncrl: checkpoint {path} is corrupt ({why}); skipped, using an older one")
    if point is None and resume:
        say("asyncrl: no checkpoint to resume from; starting a new run")
    live_dirs = {str(Path(e.run_dir).resolve()): e for e in registry.live_runs() if e.run_dir and e.id != entry.id}
    if point is not None and str(point.run_dir.resolve()) in live_dirs:
        other = live_dirs[str(point.run_dir.resolve())]
        raise ResumeError(f"run {other.id} is live in {point.run_dir}; stop it first (asyncrl ctl {other.id} stop)")
    run_dir = point.run_dir if point else prepare_run_dir(cfg.logging.run_dir, live_dirs)
    run_dir.mkdir(parents=True, exist_ok=True)
    terminal.install().attach(run_dir)
    registry.update(entry, run_dir=str(run_dir.resolve()))
    registry.write_run_file(run_dir, entry, resumed_from=point.ckpt["path"] if point else None)
    cfg_dict = json.loads(cfg.model_dump_json())
    cfg_dict["logging"]["run_dir"] = str(run_dir)
    (run_dir / CONFIG_FILE).write_text(json.dumps(cfg_dict, indent=2))
    (run_dir / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2))
    if options.prediction is not None:
        (run_dir / PLAN_FILE).write_text(json.dumps(options.prediction, indent=2))
    if machine is not None:
        (run_dir / MACHINE_FILE).write_text(json.dumps(machine, indent=2))
    resumed: Resumed | None = None
    if point is not None:
        resumed = Resumed(point, resume_message(point, rewind_run_dir(point), cfg.async_training.partial_rollout))
        say(f"asyncrl: {resumed.message}")
    placement["object_store_bytes"] = object_store_bytes(Path(model_dir))
    placement["namespace"] = run_namespace(entry.id)
    restore_env = snapshot_ray_env()  # the auth mode and loopback switch init_ray sets: this run's only
    try:
        with children_ignore_hangup():  # Ray's own processes must outlive a closed terminal's SIGHUP
            started_ray = init_ray(address, placement, options.insecure)
    except BaseException:
        restore_env()
        raise
    signals = StopSignals()
    stop = StopContext(signals, stop_grace_s(cfg), weight_bytes(Path(model_dir)), _checkpoint_root(cfg, run_dir),
                       run_dir, options.command)
    restore_signals = signals.install()
    pools = None
    try:
        import ray

        registry.update(entry, address=str(ray.get_runtime_context().gcs_address))
        registry.write_run_file(run_dir, entry, resumed_from=point.ckpt["path"] if point else None)
        check_capacity(placement)
        try:  # accelerator hardware: the pools' placement groups, each actor's options into `placement`
            pools = reserve_run(placement, cfg.name)
        except PlacementTimeout as e:
            raise RunFailed(str(e)) from None
        launch = LaunchContext(plan, entry, options, run_dir, str(model_dir), cfg_dict, provenance,
                               ActorPlacement.of(placement), stop, resumed)
        rc = 130
        try:
            rc = _run_actors(launch, tui)
        except RunFailed:
            rc = 1
            raise
        finally:
            _write_report(run_dir, rc)
        return rc
    finally:
        restore_signals()
        if pools is not None:
            pools.release()
        if started_ray:
            import ray

            ray.shutdown()
        restore_env()


def _run_actors(launch: LaunchContext, tui: TuiRunner | None) -> int:
    """Start the controller, queue, replicas, rollouter and trainer of `launch`, each with its own bound role spec
    (`LaunchContext.roles`), and supervise them to the end; 0 when the trainer finished or stopped gracefully."""
    import ray

    from engine.control.controller import create_run_controller, live_run_names
    from engine.control.knobs import knobs_at_checkpoint
    from engine.runtime.actors import MessageQueue, RolloutReplica, Rollouter, Trainer
    from engine.telemetry.console import ConsoleProgress

    cfg, entry, point, run_dir = launch.plan.config, launch.entry, launch.point, launch.run_dir
    if cfg.name in live_run_names(NAMESPACE) and not launch.options.allow_same_name:
        raise RunFailed(f"a run named {cfg.name!r} is already live on this cluster; choose another name with "
                        "--name NAME (or --set name=NAME), or pass --allow-same-name")
    total_steps = launch.plan.total_local_steps()
    actors: list[Any] = []
    # each actor gets its own spec (engine.plan.roles): sizes, device, threads and settings from the plan, and
    # this launch (identity, checkpoint parts, Ray options)
    roles = launch.roles()
    controller = create_run_controller(cfg.name, run_id=entry.id, namespace=NAMESPACE, run_dir=str(run_dir),
                                       config=launch.config, resumed_knobs=knobs_at_checkpoint(
                                           point.state if point else None, launch.config),
                                       provenance=launch.provenance, total_steps=total_steps,
                                       prediction=launch.options.prediction)
    actors.append(controller)
    console = ConsoleProgress(total_steps, enabled=launch.options.progress and cfg.logging.progress and not tui)
    ok = False
    try:
        queue = MessageQueue.remote(launch.plan.derived.max_queue_size)
        replicas = [RolloutReplica.options(**launch.placement.replica(i)).remote(roles.replica, i)
                    for i in range(roles.rollout.replicas)]
        actors += [queue, *replicas]
        _wait_ready([r.ready.remote() for r in replicas], "rollout replica")
        rollouter = Rollouter.remote(roles.rollout, queue, controller, replicas)
        # rank 0 is this actor; the spec's `rank_options` (one dict, or one per rank) place the ranks it starts
        trainer = Trainer.options(**launch.placement.rank0()).remote(roles.trainer, queue, rollouter, controller)
        actors += [rollouter, trainer]
        step, version = (point.step, point.version) if point else (0, 0)
        if launch.resumed is not None:
            _wait_ready([trainer.push_weights.remote()], "trainer (restoring the checkpoint)")
            for path, why in launch.resumed.point.skipped:
                controller.record_event.remote(run_event("warning", "checkpoint", f"checkpoint {path} is corrupt "
                                                      f"({why}); skipped", step, version, path=path))
            controller.record_event.remote(run_event("info", "resume", launch.resumed.message, step, version,
                                                  path=launch.resumed.point.ckpt["path"]))
        controller.record_event.remote(run_event("info", "start", f"run {entry.id} started in {run_dir}", step, version,
                                              total_steps=total_steps, run_id=entry.id))
        if launch.placement.auth != "token":
            controller.record_event.remote(run_event("warning", "security", "Ray token authentication is off "
                                                  "(--insecure): anyone who reaches the cluster can run code", step,
                                                  version, auth=launch.placement.auth))
        say(f"asyncrl: run {cfg.name!r} (id {entry.id}) → {run_dir}  (attach: asyncrl attach {entry.id})")

        def supervise() -> bool:
            done = _supervise(trainer, rollouter, controller, console, launch.stop)
            try:  # at once, not when the dashboard closes: `launch --tui` shows FINISHED / FAILED while it stays open
                ray.get(controller.set_state.remote("finished" if done else "failed"), timeout=10)
            except Exception:
                pass
            return done

        if tui:  # the dashboard owns the main thread (Textual needs it); the supervision loop runs beside it
            from engine.control.client import ActorSource

            ok = tui(ActorSource(controller), supervise)
        else:
            ok = supervise()
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


def _write_report(run_dir: Path, rc: int) -> None:
    """`report.md` into the run directory (`engine.telemetry.run_report`); a report that cannot be written costs
    a line, never the run's exit code."""
    from engine.telemetry.run_report import write_report

    try:
        say(f"asyncrl: report: {write_report(run_dir, rc)}")
    except Exception as e:  # noqa: BLE001 — the run's outcome stands whatever the report does
        say(f"asyncrl: the run report could not be written: {type(e).__name__}: {e}")


def _checkpoint_root(cfg: RunConfig, run_dir: Path) -> Path:
    from engine.persist.checkpoint import checkpoint_root

    return checkpoint_root(cfg, run_dir)


def _wait_ready(refs: list, what: str) -> None:
    import ray

    try:
        ray.get(refs)
    except ray.exceptions.RayActorError as e:
        raise RunFailed(f"{what} failed to start: {_root_cause(e)}") from None
    except ray.exceptions.RayTaskError as e:
        raise RunFailed(f"{what} failed to start: {_root_cause(e)}") from None


def _root_cause(e: BaseException) -> str:
    from engine.runtime.peers import describe_failure

    return describe_failure(e)


def _supervise(trainer, rollouter, controller, console, stop: StopContext) -> bool:
    """Wait for both loops; poll the controller for the progress line. True iff the trainer finished or
    stopped gracefully; raises RunFailed (after the trainer's stop checkpoint where possible) otherwise."""
    import ray

    t_ref, r_ref = trainer.fit.remote(), rollouter.fit.remote()
    pending = {t_ref: "trainer", r_ref: "rollouter"}
    cursor = 0
    failure: str | None = None  # the rollout side gave up; the trainer is stopping with a checkpoint
    trainer_result: dict[str, Any] | None = None

    def poll() -> None:
        nonlocal cursor
        snap = ray.get(controller.snapshot.remote(cursor))
        cursor = snap["cursor"]
        console.update(snap.get("metrics", []), snap.get("events", []))

    try:
        while True:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            poll()
            for ref in ready:
                name = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                    msg = f"{name} failed: {_root_cause(e)}"
                    controller.record_event.remote(run_event("error", "error", msg, None, None))
                    if name == "trainer":
                        died = isinstance(e, ray.exceptions.RayActorError)
                        raise RunFailed(f"{msg}; {stop.resume_hint(trainer_died=died)}") from None
                    raise RunFailed(f"{msg}; {stop.resume_hint()}") from None
                if name == "rollouter" and result.get("failure") and failure is None:
                    failure = result["failure"]
                    trainer.request_stop.remote(f"stopping: {failure}")
                if name == "trainer":
                    trainer_result = result
            if trainer_result is not None and failure is not None and trainer_result.get("stopped"):
                poll()  # the trainer stopped early because of the failure, after its stop checkpoint
                raise RunFailed(f"{failure}; {stop.resume_hint()}")
            if trainer_result is not None and not pending:
                poll()
                report_stop(trainer_result, stop, controller)
                return True
            if trainer_result is not None and r_ref in pending:
                # the trainer stopped the rollouter; give its loop a moment to return
                try:
                    result = ray.get(r_ref, timeout=30)
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                    raise RunFailed(f"rollouter failed: {_root_cause(e)}") from None
                pending.pop(r_ref, None)
    except KeyboardInterrupt:
        if "trainer" in pending.values():
            stop_with_checkpoint(trainer, t_ref, stop, controller)
        raise
