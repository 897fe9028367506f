"""Role specs (`engine.plan.roles`): each actor's sizes, device and threads come from one resolution of the run
config, so the rollouter, the replicas, the trainer ranks and the weight sync cannot disagree with the plan
`launch --dry-run` shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl_cli.config import load_run_config
from engine.config.schema import RunConfig
from engine.plan.roles import RunIdentity
from engine.plan.run_plan import RunPlan, resolve_plan

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "presets" / "runs" / "tiny-cpu.toml"


def tiny(*overrides: str) -> RunConfig:
    res = load_run_config(TINY, list(overrides))
    assert res.config is not None, [str(p) for p in res.problems]
    return res.config


def test_every_role_gets_the_sizes_the_plan_derived() -> None:
    cfg = tiny("trainer.ppo_mini_batch_size=3", "async_training.require_batches=2",
               "async_training.trigger_parameter_sync_step=4", "async_training.staleness_threshold=0.5",
               "rollout.total_rollout_steps=240", "rollout.max_num_seqs=16", "rollout.n=4",
               "trainer.ppo_micro_batch_size_per_gpu=4")
    plan = resolve_plan(cfg, cores=4)
    d, roles = plan.derived, plan.role_specs()
    rp, tp = roles.rollout.params, roles.trainer.params
    assert rp.required_samples == tp.required_samples == d.required_samples == 6
    assert rp.staleness_threshold == tp.staleness_threshold == 0.5 and rp.partial_rollout
    assert rp.trigger == tp.trigger == 4 and rp.seqs_per_call == 16
    assert roles.rollout.total_rollout_steps == d.total_rollout_steps == 240
    assert tp.total_local_steps == d.total_local_steps == (240 // (6 * 4)) * 4
    assert roles.rollout.replicas == plan.replicas and roles.trainer.world == plan.trainer_ranks
    # threads: the core split the driver asks Ray for
    assert roles.replica.threads == plan.actors["replica_threads"]
    assert roles.trainer.threads == plan.actors["trainer_threads"]


def test_sync_mode_is_staleness_zero_and_no_partial_rollout_in_every_role() -> None:
    plan = resolve_plan(tiny('async_training.mode="sync"', "async_training.staleness_threshold=0.5"))
    roles = plan.role_specs()
    assert plan.derived.staleness_threshold == 0.0
    assert roles.rollout.params.staleness_threshold == roles.trainer.params.staleness_threshold == 0.0
    assert roles.rollout.params.sync_mode and roles.trainer.params.sync_mode
    assert not roles.rollout.params.partial_rollout


def test_the_device_is_the_hardware_presets_in_each_role() -> None:
    roles = resolve_plan(tiny('resources.hardware="h100"', 'rollout.weight_sync="collective"')).role_specs()
    assert roles.trainer.device.type == roles.replica.device.type == "cuda"
    assert roles.weight_sync.device == "cuda" and roles.weight_sync.transport == "collective"
    assert roles.weight_sync.receivers == roles.rollout.replicas and roles.weight_sync.per_replica == 1


def test_a_vllm_replica_joins_the_weight_sync_with_each_tp_worker() -> None:
    cfg = tiny('resources.hardware="h100"', 'rollout.backend="vllm"', "rollout.tensor_parallel_size=2",
               "resources.rollout.gpus_per_node=4")
    roles = resolve_plan(cfg).role_specs()
    assert roles.rollout.replicas == 2
    assert (roles.weight_sync.per_replica, roles.weight_sync.receivers) == (2, 4)
    assert roles.replica.device.index_policy == "bundles"


def test_binding_a_launch_gives_every_role_its_identity_and_model_dir(tmp_path: Path) -> None:
    roles = resolve_plan(tiny()).role_specs()
    with pytest.raises(ValueError, match="no run identity"):
        roles.trainer.run_dir
    identity = RunIdentity("tiny-abc123", "tiny", str(tmp_path), "/models/tiny", resumed_from=None)
    bound = roles.bind(identity, replica_options={"num_cpus": 1}, rank_options={"num_cpus": 1},
                       trainer_resume={"path": "p", "state": {}})
    assert bound.trainer.run_dir == str(tmp_path) and bound.trainer.model_dir == "/models/tiny"
    assert bound.replica.model_dir == bound.rollout.model_dir == "/models/tiny"
    assert bound.trainer.resume == {"path": "p", "state": {}} and bound.rollout.resume is None
    assert bound.rollout.replica_options == {"num_cpus": 1}
    assert roles.replica.model_dir == ""  # the plan's specs stay unbound


def test_a_run_of_unknown_length_has_no_specs_and_says_why_in_one_line() -> None:
    plan = resolve_plan(tiny())
    d = type(plan.derived)(**{**plan.derived.to_json(), "total_local_steps": None, "total_train_steps": None,
                              "total_rollout_steps": None})
    unknown = RunPlan(plan.config, d, plan.hardware, plan.placement, plan.actors)
    with pytest.raises(ValueError, match="set trainer.total_steps") as err:
        unknown.role_specs()
    assert "\n" not in str(err.value)


def test_the_driver_takes_a_plan_only() -> None:
    from engine.runtime.driver import run

    with pytest.raises(TypeError, match="resolve_plan"):
        run(tiny())  # type: ignore[arg-type]


@pytest.mark.parametrize(("overrides", "on"), [
    ((), False),  # off by default
    (("resources.elastic_cores=true",), True),
    (("resources.elastic_cores=true", 'async_training.mode="sync"', "async_training.staleness_threshold=0",
      "async_training.partial_rollout=false"), False),  # sync: each phase has every core already
    (("resources.elastic_cores=true", "trainer.deterministic=true"), False),  # one pinned thread
    (("resources.elastic_cores=true", 'resources.hardware="h100"'), False),  # modelled by `plan`, not built
])
def test_elastic_cores_are_on_only_where_they_are_built(overrides: tuple[str, ...], on: bool) -> None:
    plan = resolve_plan(tiny(*overrides), cores=4)
    specs = plan.role_specs()
    assert specs.rollout.elastic.enabled is on
    assert specs.trainer.elastic is on
    if plan.actors["device"] == "cpu":  # the core lends the plan's split
        assert (specs.rollout.elastic.trainer_threads, specs.rollout.elastic.replica_threads) == \
            (plan.actors["trainer_threads"], plan.actors["replica_threads"])
