"""Resuming a run from a checkpoint (`asyncrl launch RUN.toml --resume auto|PATH`), in the driver before any
actor starts.

1. Choose. `auto`: the newest intact checkpoint of the run directory the run last wrote to (`logging.run_dir`
   or, when a relaunch stepped aside from a used one, its newest timestamped sibling — `run_dirs`); newer
   corrupt or partial ones are skipped, each with a message. PATH: that checkpoint directory (it must be
   intact; the run continues in the run directory it was taken in), or the newest intact one under PATH when
   PATH is a run directory (the run continues there) or a checkpoint root. `auto` with no checkpoint at all
   and no previous run in that run directory starts a new run.
2. Check. The model, the training data and its order, and the group size must be those the checkpoint was
   taken with (`config_fingerprint`); other settings (steps, learning rate, knobs) may change.
3. Rewind the run directory to the checkpoint. `ledger.jsonl` is cut at the checkpoint's byte offset: the
   lines after it record training the restored weights never saw, and those prompts come back from the
   checkpoint's queue / in-flight state or from the stream (the cut lines are appended to
   `ledger.rolled_back.jsonl` for audit). `metrics.jsonl` keeps only records of steps up to the checkpoint's
   step, so no step is counted twice. `events.jsonl` keeps everything (the interruption is history); a line
   torn by a kill is dropped from each file.

The rewind runs only after every check passed, and is idempotent: resuming twice from the same checkpoint
gives the same run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.persist.atomic import atomic_write_text
from engine.persist.checkpoint import (
    MANIFEST,
    CheckpointError,
    checkpoint_root,
    latest_valid,
    list_checkpoints,
    read_checkpoint,
    set_aside_newer,
    step_of,
    verify_checkpoint,
)

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

STEP_KEY = "training/global_step"


class ResumeError(RuntimeError):
    """The run cannot be resumed as asked (one line for the user)."""


@dataclass
class ResumePoint:
    """Where a resumed run continues: the checkpoint it starts from, its run directory, and the corrupt
    checkpoints skipped on the way to it."""

    ckpt: dict[str, Any]  # `read_checkpoint` output
    run_dir: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    @property
    def state(self) -> dict[str, Any]:
        return self.ckpt["state"]

    @property
    def step(self) -> int:
        return int(self.state["step"])

    @property
    def version(self) -> int:
        return int(self.state["version"])

    def trainer_resume(self) -> dict[str, Any]:
        """What `TrainerCore` restores: the backend directory and the trainer's state."""
        return {"trainer_dir": self.ckpt["trainer_dir"], "state": self.state}

    def rollout_resume(self) -> dict[str, Any]:
        """What `RolloutCore.restore` takes."""
        return {"rollout": self.state["rollout"], "queued": self.ckpt["queued"], "in_flight": self.ckpt["in_flight"]}


def config_fingerprint(cfg: RunConfig) -> dict[str, Any]:
    """The settings a checkpoint is only valid with: model, backend, group size, and what fixes the prompts."""
    d = cfg.data
    return {"model.path": cfg.model.path, "trainer.backend": cfg.trainer.backend, "rollout.n": cfg.rollout.n,
            "data.train_files": list(d.train_files), "data.prompt_key": d.prompt_key, "data.seed": d.seed,
            "data.shuffle": d.shuffle, "data.train_size": d.train_size,
            "data.max_prompt_length": d.max_prompt_length, "data.filter_overlong_prompts": d.filter_overlong_prompts}


def find_resume_point(cfg: RunConfig, resume: str) -> ResumePoint | None:
    """The checkpoint `resume` (`auto` or a path) stands for; None = `auto` found nothing: start a new run."""
    from engine.persist.run_dirs import last_written_run_dir

    run_dir = last_written_run_dir(cfg.logging.run_dir).resolve()
    skipped: list[tuple[str, str]] = []

    def skip(path: Path, why: str) -> None:
        skipped.append((str(path), why))

    if resume == "auto":
        root = checkpoint_root(cfg, run_dir)
        found = latest_valid(root, skip)
        if found is None:
            if list_checkpoints(root):
                raise ResumeError(f"no intact checkpoint under {root}: " + "; ".join(
                    f"{Path(p).name}: {why}" for p, why in skipped))
            if (run_dir / "ledger.jsonl").exists():
                raise ResumeError(f"no checkpoint under {root} to resume from; the run directory {run_dir} holds "
                                  "a run that never checkpointed (launch without --resume to start a new run)")
            return None
    else:
        found, given_run_dir = _explicit(Path(resume).expanduser(), skip)
    try:
        ckpt = read_checkpoint(found)
    except CheckpointError as e:
        raise ResumeError(str(e)) from None
    _check_fingerprint(ckpt["state"].get("fingerprint", {}), config_fingerprint(cfg), found)
    if resume != "auto":
        run_dir = given_run_dir or Path(ckpt["state"].get("run_dir") or found.parent.parent)
    point = ResumePoint(ckpt, run_dir, skipped)
    check_run_dir(point)
    return point


def _explicit(path: Path, skip: Any) -> tuple[Path, Path | None]:
    """`--resume PATH`: a checkpoint directory, or a run directory / checkpoint root holding some. Returns the
    checkpoint and, when PATH is a run directory, that directory (the run continues there)."""
    if (path / MANIFEST).exists() or step_of(path) is not None:
        problem = verify_checkpoint(path) if path.is_dir() else "no such directory"
        if problem:
            raise ResumeError(f"checkpoint {path} cannot be used: {problem} (--resume auto takes the newest "
                              "intact one)")
        return path, None
    for root, run_dir in ((path / "checkpoints", path.resolve()), (path, None)):
        if list_checkpoints(root):
            found = latest_valid(root, skip)
            if found is None:
                raise ResumeError(f"no intact checkpoint under {root}")
            return found, run_dir
    raise ResumeError(f"no checkpoint at {path} (expected a global_step_<n> directory or a run directory)")


def _check_fingerprint(saved: dict[str, Any], now: dict[str, Any], path: Path) -> None:
    diffs = [f"{k} is {now[k]!r} here but was {saved[k]!r}" for k in now if k in saved and saved[k] != now[k]]
    if diffs:
        raise ResumeError(f"cannot resume from {path}: {'; '.join(diffs)} (the checkpoint needs the same model, "
                          "data and group size)")


def rewind_run_dir(point: ResumePoint) -> dict[str, int]:
    """Cut the ledger at the checkpoint, keep metrics of steps ≤ its step, drop torn lines. Returns counts."""
    run_dir = point.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ledger_lines = _cut_ledger(run_dir / "ledger.jsonl", int(point.state["ledger_bytes"]),
                               point.state.get("ledger_sha256"), run_dir / "ledger.rolled_back.jsonl")
    set_aside = set_aside_newer(Path(point.ckpt["path"]).parent, point.step)
    metrics = _filter_jsonl(run_dir / "metrics.jsonl",
                            lambda r: not isinstance(r.get(STEP_KEY), (int, float)) or r[STEP_KEY] <= point.step)
    _filter_jsonl(run_dir / "events.jsonl", lambda r: True)
    return {"ledger_lines": ledger_lines, "metric_records": metrics, "set_aside": len(set_aside)}


def check_run_dir(point: ResumePoint) -> None:
    """The run directory's ledger must start with the one the checkpoint saw (raises ResumeError)."""
    _ledger_tail(point.run_dir / "ledger.jsonl", int(point.state["ledger_bytes"]), point.state.get("ledger_sha256"))


def _ledger_tail(path: Path, offset: int, sha256: str | None) -> bytes:
    """The bytes after the checkpoint's position, after checking that the bytes before are the checkpoint's."""
    data = path.read_bytes() if path.exists() else b""
    if len(data) < offset:
        raise ResumeError(f"{path} has {len(data)} bytes but the checkpoint recorded {offset}: the run directory "
                          "does not belong to this checkpoint or was modified")
    if sha256 is not None and hashlib.sha256(data[:offset]).hexdigest() != sha256:
        raise ResumeError(f"{path} differs from the ledger the checkpoint saw: the run directory does not belong "
                          "to this checkpoint or was modified")
    return data[offset:]


def _cut_ledger(path: Path, offset: int, sha256: str | None, rolled_back: Path) -> int:
    tail = _ledger_tail(path, offset, sha256)
    if not tail:
        return 0
    whole = tail[: tail.rfind(b"\n") + 1]
    if whole:
        with rolled_back.open("ab") as out:
            out.write(whole)
    os.truncate(path, offset)
    return whole.count(b"\n")


def _filter_jsonl(path: Path, keep: Any) -> int:
    """Rewrite `path` (atomically) without the records `keep` rejects and without torn lines; returns the
    number of records removed."""
    if not path.exists():
        return 0
    kept, removed = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if keep(rec):
            kept.append(line)
        else:
            removed += 1
    atomic_write_text(path, "".join(line + "\n" for line in kept))
    return removed


def resume_message(point: ResumePoint, rewound: dict[str, int], partial_rollout: bool) -> str:
    """One line for the console and the `resume` event."""
    in_flight = point.ckpt["in_flight"]
    prefixes = sum(1 for d in in_flight for r in d.get("todo", {}).values() if r.get("prefix_ids"))
    how = f"{prefixes} trajectories continue from a saved prefix" if partial_rollout and prefixes else \
        "unfinished trajectories regenerate from the prompt"
    return (f"resumed from {point.ckpt['path']} at step {point.step}, version {point.version}: "
            f"{len(point.ckpt['queued'])} queued group(s) re-queued, {len(in_flight)} in-flight prompt(s) re-issued "
            f"({how}); rolled back {rewound['ledger_lines']} ledger line(s) and {rewound['metric_records']} "
            "metric record(s) written after the checkpoint"
            + (f"; {rewound['set_aside']} newer checkpoint(s) set aside" if rewound.get("set_aside") else "")
            + (_light_note(point.state) or _version_note(point.state)))


def _version_note(state: dict[str, Any]) -> str:
    """For a full checkpoint taken between two syncs: which weights the replicas continue with."""
    since = int(state.get("since_sync") or 0)
    if since <= 0:
        return ""
    v, step = state.get("version"), state.get("step")
    if state.get("version_weights"):
        return (f"; taken {since} step(s) after the sync of version {v}: the replicas get version {v}'s own "
                f"weights (kept at its sync), the trainer continues from step {step}'s")
    return (f"; taken {since} step(s) after the sync of version {v}, without that version's weights (this mode "
            f"keeps none: rollout_correction.bypass_mode outside deterministic mode): the replicas continue with "
            f"the weights of step {step}, not version {v}'s, until the next sync")


def _light_note(state: dict[str, Any]) -> str:
    """For a light stop state (`engine.persist.stop_grace`): whose weights the run continues with."""
    if state.get("stop_state") != "light":
        return ""
    w = state.get("weights_step")
    weights = f"the weights of step {w}" if w is not None else "the model's initial weights"
    return (f"; a light stop state: no prompt is lost, the training continues from {weights} (the updates of the "
            f"steps after it, up to {state.get('step')}, are not in them)")
