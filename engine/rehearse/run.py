"""`rehearse(plan, config)`: every role of a run built as `launch` builds it, at full scale, in one CPU process.

What runs, in order, each through the function the launch path itself calls:

    auto settings   `engine.launch.probe.resolve_auto` (on cuda / npu nothing is timed: bf16, sdpa)
    roles           `RunPlan.role_specs()` (`engine.plan.roles.role_specs`): M trainer ranks, R replicas
    transport       `engine.runtime.backends.build_weight_sync(spec.weight_sync)` — the transport object trainer
                    rank 0 constructs, for the preset's real device (constructed, never connected)
    vLLM            `vllm_options(replica.engine, plan.devices["rollout"])` → `engine_args(...)`: the engine
                    arguments of a replica on the preset's device, and the installed vLLM's version
    trainer ranks   one representative rank per class of symmetric ranks (`engine.rehearse.torch_rank`,
                    `engine.rehearse.megatron_rank`), built and stepped on fake tensors over a fake world of M;
                    FSDP2's ranks other than 0 receive their shards from rank 0's load as at launch (rank 0's
                    class first: `fake.FromRank0` carries what it sent)

Every failure is recorded with its role, rank and phase, and the rehearsal goes on with the next role (a broken
transport does not hide a memory problem). A rank whose rehearsed device peak exceeds the device's memory
(`resources.hardware`'s `memory_gb`) fails too, and so does a trainer node whose ranks' host peaks add up to more
than its RAM (`host_memory_gb`, `engine.rehearse.nodes`).
"""

from __future__ import annotations

import io
import json
import tempfile
import time
import warnings
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.rehearse.report import GB, RankClass, Rehearsal, RehearsalFailure, first_line

if TYPE_CHECKING:
    from engine.plan.run_plan import RunPlan


def resolved_plan(plan: RunPlan, config: dict[str, Any]) -> tuple[RunPlan, list[str]]:
    """The plan with its "auto" settings decided as the driver decides them (`resolve_auto` reads the model's
    config.json from a directory: a temporary one holding `config`), and the decision lines."""
    from engine.launch.probe import resolve_auto

    out = io.StringIO()
    with tempfile.TemporaryDirectory(prefix="asyncrl-rehearse-") as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(config))
        resolved, _ = resolve_auto(plan, tmp, out=out)
    return resolved, [line.removeprefix("asyncrl: ") for line in out.getvalue().splitlines() if line.strip()]


def layout(plan: RunPlan) -> dict[str, Any]:
    """The trainer's parallel layout (world, and for Megatron tp/pp/cp/ep/etp and the data-parallel sizes)."""
    t, world = plan.config.trainer, plan.trainer_ranks
    if t.backend != "megatron":
        return {"world": world, "fsdp": world if world > 1 else 1}
    dp = world // max(1, t.tp * t.pp * t.cp)
    return {"world": world, "tp": t.tp, "pp": t.pp, "cp": t.cp, "ep": t.ep, "etp": t.etp, "dp": dp,
            "expert_dp": world // max(1, t.ep * t.etp * t.pp)}


def transport(plan: RunPlan) -> dict[str, Any]:
    """The weight-sync transport trainer rank 0 builds (`build_weight_sync`), described; raises what it raises."""
    from engine.plan.devices import COLLECTIVE_BACKEND
    from engine.runtime.backends import build_weight_sync

    ws = plan.role_specs().weight_sync
    built = build_weight_sync(ws, run_id="rehearse")
    close = getattr(built, "close", None)
    if callable(close):
        close()
    return {"kind": ws.transport, "device": ws.device, "backend": COLLECTIVE_BACKEND.get(ws.device, ""),
            "class": type(built).__name__, "group_ranks": 1 + ws.receivers if ws.transport != "object_store"
            else None, "receivers": ws.receivers, "per_replica": ws.per_replica, "bucket_bytes": ws.bucket_bytes}


def vllm_arguments(plan: RunPlan) -> dict[str, Any]:
    """A replica's engine arguments on the preset's rollout device, and the vLLM version installed here."""
    from engine.runtime.backends import vllm_options

    cfg = plan.config
    if cfg.rollout.backend != "vllm":
        return {"backend": cfg.rollout.backend}
    from engine.rollout.vllm.backend import engine_args

    device = plan.devices["rollout"]
    try:
        installed = version("vllm")
    except PackageNotFoundError:
        installed = "not installed here"
    return {"device": device.type, "index_policy": device.index_policy, "version": installed,
            "engine_args": engine_args("<model_dir>", **vllm_options(plan.role_specs().replica.engine, device))}


def rank_classes(plan: RunPlan) -> list[RankClass]:
    """The trainer's classes of symmetric ranks (one representative each)."""
    if plan.config.trainer.backend == "megatron":
        from engine.rehearse.megatron_rank import megatron_rank_classes

        return megatron_rank_classes(plan)
    from engine.rehearse.torch_rank import torch_rank_classes

    return torch_rank_classes(plan.trainer_ranks)


def rehearse_rank(plan: RunPlan, config: dict[str, Any], cls: RankClass, step: bool, rank0: Any = None) -> RankClass:
    """Rehearse `cls`'s representative rank; `rank0` (FSDP2: `fake.FromRank0`): what rank 0 sent, for the others."""
    if plan.config.trainer.backend == "megatron":
        from engine.rehearse.megatron_rank import rehearse_megatron_rank

        return rehearse_megatron_rank(plan, config, cls.rank, cls, step)
    if plan.trainer_ranks < 2:
        raise RehearsalFailure("trainer", 0, "build", "a single-rank trainer is not rehearsed (no process group: "
                               "run it on the CPU)")
    from engine.rehearse.torch_rank import rehearse_torch_rank

    return rehearse_torch_rank(plan, config, cls.rank, cls, step, rank0)


def _attempt(report: Rehearsal, role: str, rank: int | str, phase: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except RehearsalFailure as f:
        report.failures.append(f)
    except Exception as e:  # noqa: BLE001 - every failure is reported with its role and rank, never raised
        report.failures.append(RehearsalFailure(role, rank, phase, first_line(e)))
    return None


def rehearse(plan: RunPlan, config: dict[str, Any], progress: Callable[[str], None] | None = None) -> Rehearsal:
    """Rehearse `plan` (a resolved `RunPlan`) with the model of `config` (its config.json as a dict). The
    libraries' warnings (missing Transformer Engine / Apex, deprecated collectives) are silenced: the report
    says what was and was not rehearsed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _rehearse(plan, config, progress)


def _rehearse(plan: RunPlan, config: dict[str, Any], progress: Callable[[str], None] | None) -> Rehearsal:
    from engine.rehearse.batch import micro_shape
    from engine.rehearse.fake import FromRank0

    say = progress or (lambda _: None)
    start = time.perf_counter()
    cfg = plan.config
    report = Rehearsal(cfg.name, plan.device, cfg.trainer.backend, plan.trainer_ranks, layout(plan))
    resolved = _attempt(report, "plan", "-", "auto settings", lambda: resolved_plan(plan, config))
    if resolved is None:
        return report
    plan, report.auto = resolved
    if _attempt(report, "plan", "-", "roles", plan.role_specs) is None:
        return report
    report.micro_batches = {"update": micro_shape(plan.config).to_json(),
                            "log_prob": micro_shape(plan.config, log_prob=True).to_json()}
    say("weight-sync transport")
    report.transport = _attempt(report, "weight sync", 0, "transport", lambda: transport(plan)) or {}
    say("vLLM engine arguments")
    report.vllm = _attempt(report, "rollout", 0, "engine arguments", lambda: vllm_arguments(plan)) or {}
    capacity = plan.hardware.memory_gb * GB
    stepped: RankClass | None = None
    rank0 = FromRank0()  # rank 0's class comes first: the others receive from it
    for cls in rank_classes(plan):
        say(f"trainer {cls.name}")
        step = stepped is None
        done = _attempt(report, "trainer", cls.rank, "rehearsal", lambda c=cls, s=step: rehearse_rank(plan, config, c, s, rank0))
        if done is None:
            continue
        if not step and stepped is not None:  # every rank's shards have the same shapes: the step is the first's
            cls.device_peak, cls.peak_by_category = stepped.device_peak, dict(stepped.peak_by_category)
            cls.phase_peaks, cls.model_excludes = dict(stepped.phase_peaks), list(stepped.model_excludes)
            cls.notes.append(f"step not repeated: every rank's shards have the same shapes ({stepped.name} measured)")
        elif step:
            stepped = cls
        report.ranks.append(cls)
        if cls.device_peak > capacity:
            report.failures.append(RehearsalFailure(
                "trainer", cls.rank, "device memory", f"rehearsed peak {cls.device_peak / GB:.1f} GB exceeds the "
                f"{plan.hardware.memory_gb:g} GB of a {plan.hardware.name} device"))
    from engine.rehearse.nodes import node_host

    report.nodes, over = node_host(plan, report.ranks)
    report.failures.extend(over)
    report.seconds = time.perf_counter() - start
    return report
