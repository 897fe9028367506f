"""Role specs: what each actor of a run is handed, resolved once from the run config by `resolve_plan`.

One frozen dataclass per role, carrying the sizes derived once (`engine.plan.sizes.derive`), the role's device
(`engine.plan.devices.RoleDevice`), its share of the placement (threads; Ray options once the driver placed the
pools), the typed parts of the config it uses (`engine.plan.role_parts`: no spec holds the whole config) and,
bound by the driver at launch, the run's identity:

    RolloutSpec     the Rollouter: the `RolloutLoop`'s parameters (`engine.loop.params.loop_params`, the one
                    mapping from the config: required_samples, the staleness in force — 0 in sync mode —, the
                    sync interval, partial rollout off in sync and deterministic mode),
                    total_rollout_steps (the prompt stream's length), R replicas and the `ReplicaSpec` it starts
                    replacements from, the training and validation sampling, the prompts (`PromptSpec`), the
                    reward (`ScoringSpec`), the multi-turn tools, the replica restart budget, fault injection, the
                    checkpoint's rollout part on resume
    ReplicaSpec     one rollout replica: its engine (`EngineSpec`), the rollout `RoleDevice`, its threads
    TrainerSpec     trainer rank 0 (and, through `world`, ranks 1 … M−1): the `TrainerLoop`'s parameters
                    (`loop_params` too: required_samples, total_local_steps = total_train_steps × trigger, sync mode, the hard cap,
                    the checkpoint cadence), M ranks, the trainer `RoleDevice`, its threads, the weight sync, the
                    backend (`BackendSpec`: the precision policy, derived here once), the loss (`LossSpec`), the
                    batch preparation, the checkpoints (`CheckpointSpec`), fault injection, the checkpoint's
                    trainer part on resume
    WeightSyncSpec  the weight-sync transport: object store or collective, on which device, with how many
                    receiving ranks (R × the vLLM TP workers of a replica), bucket size
    RunIdentity     bound at launch (`RoleSpecs.bind`): run id, name, run directory, the model directory the
                    preflight resolved, the checkpoint a resume continues from

An actor reads its sizes, device and settings from its spec and nothing else: no actor sees the config,
re-derives a size or a policy from it, reloads the hardware preset or re-reads the training data's parquet
footers. Pure Python (no torch, no Ray).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from engine.loop.elastic import ElasticParams
from engine.loop.params import loop_params
from engine.loop.rollout import RolloutParams
from engine.loop.trainer import TrainerParams
from engine.plan.devices import RoleDevice, weight_sync_transport
from engine.plan.role_parts import (
    BackendSpec, BatchPrepSpec, CheckpointSpec, EngineSpec, FaultSpec, LossSpec, PromptSpec, ScoringSpec,
    backend_spec, batch_prep_spec, checkpoint_spec, engine_spec, fault_spec, loss_spec, prompt_spec, sampling_of,
    scoring_spec,
)
from engine.types import SamplingParams

if TYPE_CHECKING:
    from engine.config.multi_turn import MultiTurnConfig
    from engine.config.schema import RunConfig
    from engine.plan.sizes import Derived

MIB = 2**20


@dataclass(frozen=True)
class RunIdentity:
    """Who and where a launched run is: what the driver decides before the actors start."""

    run_id: str
    name: str
    run_dir: str
    model_dir: str
    """The model directory the preflight resolved (a converted built-in model, or the configured path)."""
    resumed_from: str | None = None
    """The checkpoint this run continues from (None: a new run)."""


@dataclass(frozen=True)
class WeightSyncSpec:
    """How trainer rank 0 pushes weights to the replicas (`engine.runtime.backends.build_weight_sync`)."""

    transport: str
    """`rollout.weight_sync` resolved ("auto" → `engine.plan.devices.weight_sync_transport`): "shared_memory",
    "collective" (one broadcast group) or "object_store"."""
    device: str
    """The trainer's device type: the collective's backend is this device's (`COLLECTIVE_BACKEND`)."""
    receivers: int
    """Receiving ranks of the collective group: R replicas × `per_replica`."""
    per_replica: int
    """Ranks one replica takes in the group: its vLLM workers (TP × PP × DP), 1 for `hf`."""
    bucket_bytes: int
    """`rollout.weight_sync_bucket_mb` in bytes."""
    corrupt_bucket: int | None = None
    """`debug.corrupt_sync_bucket`: fault injection (the delivery check must catch it)."""
    quantization: str | None = None
    """`rollout.quantization`: "fp8" quantises each bucket on the sender (`engine.sync.fp8`); None sends the
    export dtype."""


@dataclass(frozen=True)
class ReplicaSpec:
    """One rollout replica (`engine.runtime.replica.ReplicaShell`; its actor `engine.runtime.actors.RolloutReplica`)."""

    engine: EngineSpec
    device: RoleDevice
    threads: int
    """torch intra-op threads of the replica's process (the plan's core split on CPU)."""
    faults: FaultSpec = FaultSpec()
    """Fault injection that acts inside the replica (the mid-transfer kill)."""
    model_dir: str = ""
    """Bound at launch (`RoleSpecs.bind`)."""


@dataclass(frozen=True)
class RolloutSpec:
    """The Rollouter (`engine.runtime.rollouter`)."""

    params: RolloutParams
    total_rollout_steps: int
    """Prompts the run generates: min(rollout.total_rollout_steps, train_size × total_epochs)."""
    replicas: int
    """R."""
    replica: ReplicaSpec
    """What a replacement replica is started from."""
    sampling: SamplingParams
    val_sampling: SamplingParams
    prompts: PromptSpec
    scoring: ScoringSpec
    tools: MultiTurnConfig | None
    """`rollout.multi_turn` when enabled (the tools, their sandbox and parser: `engine.runtime.tool_shell`)."""
    max_replica_restarts: int
    faults: FaultSpec = FaultSpec()
    replica_options: Any = None
    """Ray options of a replica slot (one dict for all, or a list by slot: its placement-group bundles); bound at
    launch. None: no replacement replicas."""
    identity: RunIdentity | None = None
    resume: dict[str, Any] | None = None
    """A checkpoint's rollout part (`{"rollout", "queued", "in_flight"}`), on resume."""
    elastic: ElasticParams = ElasticParams(1, 1)
    """`resources.elastic_cores`: the plan's thread split and whether the rollouter lends it
    (`engine.loop.elastic`; off unless `elastic_params` turns it on)."""

    @property
    def model_dir(self) -> str:
        return self.replica.model_dir


@dataclass(frozen=True)
class TrainerSpec:
    """Trainer rank 0 (`engine.runtime.trainer_actor`) and, with `world` > 1, the ranks it starts
    (`engine.runtime.trainer_group`)."""

    params: TrainerParams
    world: int
    """M, the trainer ranks."""
    device: RoleDevice
    threads: int
    """torch intra-op threads of each rank's process."""
    weight_sync: WeightSyncSpec
    backend: BackendSpec
    loss: LossSpec
    batch: BatchPrepSpec
    checkpoint: CheckpointSpec
    faults: FaultSpec = FaultSpec()
    rank_options: Any = None
    """Ray options of the ranks (one dict for all, or a list by rank); bound at launch."""
    elastic: bool = False
    """Elastic cores on (`RolloutSpec.elastic`): the trainer reports its waits and steps to the rollouter and takes
    the threads it answers at each local step."""
    identity: RunIdentity | None = None
    resume: dict[str, Any] | None = None
    """A checkpoint's trainer part (`{"path", "state"}`), on resume."""

    @property
    def model_dir(self) -> str:
        return self.identity.model_dir if self.identity else ""

    @property
    def run_dir(self) -> str:
        if self.identity is None:
            raise ValueError("the trainer spec has no run identity: bind it first (RoleSpecs.bind)")
        return self.identity.run_dir


@dataclass(frozen=True)
class RoleSpecs:
    """Every role of a run (see the module docstring)."""

    rollout: RolloutSpec
    trainer: TrainerSpec

    @property
    def replica(self) -> ReplicaSpec:
        return self.rollout.replica

    @property
    def weight_sync(self) -> WeightSyncSpec:
        return self.trainer.weight_sync

    def bind(self, identity: RunIdentity, *, rollout_resume: dict[str, Any] | None = None,
             trainer_resume: dict[str, Any] | None = None, replica_options: Any = None,
             rank_options: Any = None) -> RoleSpecs:
        """The specs of a launched run: its identity, the model directory, the checkpoint parts on resume and the
        Ray options the driver's placement gave each actor."""
        replica = replace(self.replica, model_dir=identity.model_dir)
        return RoleSpecs(
            rollout=replace(self.rollout, replica=replica, replica_options=replica_options, identity=identity,
                            resume=rollout_resume),
            trainer=replace(self.trainer, rank_options=rank_options, identity=identity, resume=trainer_resume))


def elastic_params(cfg: RunConfig, d: Derived, actors: dict[str, Any]) -> ElasticParams:
    """The elastic-cores core's parameters: the plan's split (`actors`: `engine.plan.placement.actor_resources`)
    and the switch — on only where it is built: `resources.elastic_cores` on `device = "cpu"`, fully async, one
    trainer rank, not `trainer.deterministic` (which pins one thread) and an `hf` rollout."""
    on = (cfg.resources.elastic_cores and actors.get("device") == "cpu" and cfg.async_training.mode != "sync"
          and d.trainer_world == 1 and not cfg.trainer.deterministic and cfg.rollout.backend == "hf")
    return ElasticParams(int(actors["trainer_threads"]), int(actors["replica_threads"]), d.trainer_world,
                         d.rollout_replicas, bool(on))


def weight_sync_spec(cfg: RunConfig, d: Derived, trainer_device: RoleDevice) -> WeightSyncSpec:
    """The weight sync of `cfg`: a vLLM replica joins the collective with each of its TP × PP × DP workers."""
    from engine.plan.rollout_replica import replica_gpus

    per_replica = replica_gpus(cfg) if cfg.rollout.backend == "vllm" else 1
    return WeightSyncSpec(transport=weight_sync_transport(cfg, trainer_device.type), device=trainer_device.type,
                          receivers=d.rollout_replicas * per_replica, per_replica=per_replica,
                          bucket_bytes=cfg.rollout.weight_sync_bucket_mb * MIB,
                          corrupt_bucket=cfg.debug.corrupt_sync_bucket, quantization=cfg.rollout.quantization)


def role_specs(cfg: RunConfig, d: Derived, devices: dict[str, RoleDevice], actors: dict[str, Any]) -> RoleSpecs | None:
    """Every role's spec (unbound: no identity yet); None when the run's length is unknown (the training data is
    not available locally and neither `trainer.total_steps` nor `rollout.total_rollout_steps` bounds it)."""
    if d.total_local_steps is None or d.total_rollout_steps is None:
        return None
    loop = loop_params(cfg, d.total_rollout_steps)  # the loop cores' parameters: built once, here
    faults = fault_spec(cfg)
    replica = ReplicaSpec(engine_spec(cfg), devices["rollout"], int(actors["replica_threads"]), faults)
    mt = cfg.rollout.multi_turn
    rollout = RolloutSpec(loop.rollout, d.total_rollout_steps, d.rollout_replicas, replica,
                          sampling_of(cfg), sampling_of(cfg, validation=True), prompt_spec(cfg),
                          scoring_spec(cfg.data), mt if mt.enable else None, cfg.rollout.max_replica_restarts,
                          faults, elastic=elastic_params(cfg, d, actors))
    trainer = TrainerSpec(loop.trainer, d.trainer_world, devices["trainer"],
                          int(actors["trainer_threads"]), weight_sync_spec(cfg, d, devices["trainer"]),
                          backend_spec(cfg), loss_spec(cfg), batch_prep_spec(cfg),
                          checkpoint_spec(cfg), faults,
                          elastic=rollout.elastic.enabled)
    return RoleSpecs(rollout, trainer)
