"""The launch context: everything the driver decided before the actors start, in one frozen, typed value.

`engine.runtime.driver` builds it once the run directory, the model, the checkpoint to continue from, Ray and
the placement are settled, and hands it to the code that starts and supervises the actors:

    LaunchOptions   how the user launched: the command line (for the resume hint), --allow-same-name, the plan's
                    prediction (`launch --plan`), --insecure, the progress line
    ActorPlacement  the Ray options of every replica slot and trainer rank (placement-group bundles on
                    accelerators, the plan's CPU split otherwise) and the cluster's auth mode
    Resumed         the checkpoint a resumed run continues from, and the line that says so
    StopContext     what a stop needs: the signals, the grace period, the model's weight bytes, and where the
                    resume hint looks for checkpoints (the run directory, the checkpoint root, the command)
    LaunchContext   the plan, the registry entry, the run and model directories, the resolved config the
                    controller starts from, the provenance, and the four above; `roles()` binds the plan's role
                    specs to this launch (`engine.plan.roles.RoleSpecs.bind`)

No Ray at import.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.persist.run_dirs import resume_command, resume_hint
from engine.plan.roles import RoleSpecs, RunIdentity

if TYPE_CHECKING:
    from engine.control.registry import RunEntry
    from engine.persist.resume import ResumePoint
    from engine.plan.run_plan import RunPlan
    from engine.runtime.stop_signals import StopSignals


@dataclass(frozen=True)
class LaunchOptions:
    """`engine.runtime.driver.run`'s keywords about the launch itself."""

    command: list[str] | None = None
    """The launch as the user typed it (without `--resume`); the resume hint appends `--resume <run dir>`."""
    allow_same_name: bool = False
    prediction: dict[str, Any] | None = None
    """The plan's expectation (`launch --plan`): written to `<run dir>/plan.json`, shown by the dashboard."""
    insecure: bool = False
    """`launch --insecure`: Ray without token auth (a warning event)."""
    progress: bool = True


@dataclass(frozen=True)
class ActorPlacement:
    """The Ray options the actors start with, after the driver reserved the pools (`reserve_run`)."""

    replica_options: dict[str, Any] | list[dict[str, Any]]
    """One dict for every replica slot, or a list by slot (a slot's placement-group bundles): a replacement replica
    takes its slot's."""
    trainer_options: dict[str, Any] | list[dict[str, Any]]
    """One dict for every trainer rank, or a list by rank."""
    replicas: int
    auth: str = "token"
    """The Ray cluster's auth mode: "token", or "disabled (--insecure)"."""

    @classmethod
    def of(cls, placement: dict[str, Any]) -> ActorPlacement:
        """From the driver's placement record (`engine.plan.placement.actor_resources`, completed by `init_ray`
        and `reserve_run`)."""
        return cls(placement.get("replica_options") or placement["replica_res"],
                   placement.get("trainer_options") or placement["trainer_res"], int(placement["replicas"]),
                   str(placement.get("auth", "token")))

    def replica(self, slot: int) -> dict[str, Any]:
        opts = self.replica_options
        return opts[slot] if isinstance(opts, list) else opts

    def rank0(self) -> dict[str, Any]:
        opts = self.trainer_options
        return opts[0] if isinstance(opts, list) else opts


@dataclass(frozen=True)
class Resumed:
    """A resumed run: the checkpoint it continues from and the line announcing it."""

    point: ResumePoint
    message: str


@dataclass(frozen=True)
class StopContext:
    """What the driver's stop path needs (`engine.runtime.stopping`)."""

    signals: StopSignals
    grace_s: float | None
    """`resources.stop_grace_s` (or `$ASYNCRL_STOP_GRACE_S`): the stop checkpoint's deadline; None: none."""
    weight_bytes: int
    """The model's weight bytes: the prior of a full checkpoint's write time."""
    checkpoint_root: Path
    run_dir: Path
    command: list[str] | None = None

    def resume_hint(self, trainer_died: bool = False) -> str:
        """What a resume would continue from, and the command (`engine.persist.run_dirs.resume_hint`)."""
        return resume_hint(self.checkpoint_root, self.run_dir, self.command, trainer_died=trainer_died)

    def resume_command(self) -> str:
        return resume_command(self.command, self.run_dir)


@dataclass(frozen=True)
class LaunchContext:
    """One launch, as the driver hands it to the actor-starting code (see the module docstring)."""

    plan: RunPlan
    entry: RunEntry
    options: LaunchOptions
    run_dir: Path
    model_dir: str
    config: dict[str, Any]
    """The resolved config as written to `config.resolved.json` (the run directory filled in); the controller's
    knobs start from it (on resume, the live values of the checkpoint: `engine.runtime.driver`)."""
    provenance: dict[str, Any]
    placement: ActorPlacement
    stop: StopContext
    resumed: Resumed | None = None

    @property
    def point(self) -> ResumePoint | None:
        return self.resumed.point if self.resumed else None

    def identity(self) -> RunIdentity:
        point = self.point
        return RunIdentity(self.entry.id, self.plan.config.name, str(self.run_dir), str(self.model_dir),
                           point.ckpt["path"] if point else None)

    def roles(self) -> RoleSpecs:
        """The plan's role specs bound to this launch: identity, model directory, the checkpoint's parts on
        resume, and the Ray options of the replica slots (a replacement takes the dead one's) and trainer ranks."""
        point = self.point
        return self.plan.role_specs().bind(
            self.identity(), rollout_resume=point.rollout_resume() if point else None,
            trainer_resume=point.trainer_resume() if point else None,
            replica_options=self.placement.replica_options, rank_options=self.placement.trainer_options)
