"""The runtime's own compute (hf replicas, torch trainer ranks) runs on the hardware preset's device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from run_helpers import tiny_config

from engine.models.loader import resolve_model_path
from engine.plan.devices import process_group_backend
from engine.runtime.backends import (
    build_rollout_backend,
    build_trainer_backend,
    check_device,
)
from engine.plan.run_plan import resolve_plan


def test_cpu_preset_builds_cpu_replicas_and_trainer_over_gloo(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    plan = resolve_plan(cfg)
    devices, roles = plan.devices, plan.role_specs()
    device = devices["trainer"].type
    assert (device, process_group_backend(device)) == ("cpu", "gloo")
    model_dir = str(resolve_model_path(cfg.model.path))
    trainer = build_trainer_backend(roles.trainer.backend, model_dir, device=devices["trainer"])
    replica = build_rollout_backend(roles.replica.engine, model_dir, devices["rollout"])
    assert trainer.device == torch.device("cpu")
    assert {p.device.type for p in replica.model.parameters()} == {"cpu"}


@pytest.mark.parametrize(("hardware", "device", "group"), [("h100", "cuda", "cpu:gloo,cuda:nccl"),
                                                         ("ascend-910b", "npu", "cpu:gloo,npu:hccl")])
def test_accelerator_presets_put_the_compute_on_the_accelerator(
    tmp_path: Path, hardware: str, device: str, group: str
) -> None:
    cfg = tiny_config(tmp_path, f'resources.hardware="{hardware}"')
    devices = resolve_plan(cfg).devices
    assert {d.type for d in devices.values()} == {device} and process_group_backend(device) == group


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a GPU")
def test_a_gpu_preset_on_a_machine_without_gpus_fails_with_one_clear_line() -> None:
    with pytest.raises(RuntimeError, match='device = "cuda", but this worker sees no CUDA GPU'):
        check_device("cuda")
    assert check_device("cpu") == "cpu"


@pytest.mark.parametrize(("budgets", "micro_batches"), [(False, 3), (True, 1)])
def test_the_trainer_runs_the_configured_token_budget_and_attention(tmp_path: Path, budgets: bool,
                                                                   micro_batches: int) -> None:
    """`trainer.use_dynamic_bsz` / `ppo_max_token_len_per_gpu` and `trainer.attn_implementation` reach the
    trainer built from the config: 12 rows are 3 micro-batches of 4 rows, or one within a 4096-token budget."""
    from engine.algo.loss import build_loss_fn
    from engine.trainer.batch import collate
    from engine.types import Trajectory

    cfg = tiny_config(tmp_path, "trainer.ppo_micro_batch_size_per_gpu=4", 'trainer.attn_implementation="eager"',
                      f"trainer.use_dynamic_bsz={str(budgets).lower()}", "trainer.ppo_max_token_len_per_gpu=4096")
    model_dir = str(resolve_model_path(cfg.model.path))
    spec = resolve_plan(cfg).role_specs().trainer
    trainer = build_trainer_backend(spec.backend, model_dir, device=spec.device)
    assert trainer.model.config._attn_implementation == "eager"
    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(3, 27, (5,), generator=gen).tolist(),
             Trajectory(torch.randint(3, 27, (4,), generator=gen).tolist(), [-1.0] * 4, "length", 0, 0))
            for _ in range(12)]
    batch = collate(rows, pad_token_id=0)
    batch.advantages = torch.randn(batch.responses.shape, generator=gen) * batch.response_mask
    batch.rollout_log_probs, _ = trainer.compute_log_probs(batch)
    metrics = trainer.train_step(batch, build_loss_fn(spec.loss, spec.loss.rollout_correction))
    assert metrics["actor/micro_batches"] == micro_batches
