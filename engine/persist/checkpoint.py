"""Run checkpoints on disk: everything needed to continue an asynchronous run where it was.

Layout of `<checkpoint root>/global_step_<local step>/`:

    trainer/         the trainer backend's own save (weights, optimizer, RNG states); taken between two syncs,
                     also the version's weights (the snapshot of the last sync, `save_version`)
    state.json       version, local step, counters, ledger position, prompt-stream position, budget
    queued.json      the TrajectoryGroups waiting to be trained (the trainer's buffer first, then the queue)
    in_flight.json   the prompts being generated: their finished trajectories and, for every unfinished
                     one, the request to re-issue (prompt + saved prefix + the version of its first token)
    manifest.json    sha256 and size of every other file; written last

A *light* checkpoint (a stop under a deadline, `engine.persist.stop_grace`) writes the three JSON files of its
own step and takes `trainer/` from an earlier full checkpoint by hard links (copied where links fail), with
that checkpoint's checksums (the files are the same bytes); its manifest names the source (`weights_from`).
Without an earlier checkpoint it has no `trainer/` and the manifest says `"weights_from": "initial"`: the
resume starts from the model's own weights.

Atomic publish (`engine.persist.atomic.publish_dir`): everything is written into `.tmp-global_step_<s>-<pid>/`
and fsynced, the directory is renamed to its final name and the parent fsynced. A crash leaves only a `.tmp-*` directory, which readers
ignore and the next save removes. A directory whose manifest is missing or unreadable, or disagrees with
the files (one truncated, edited or missing), is corrupt: `latest_valid` skips it with a message and takes
the previous one. Only the newest `keep_last` complete checkpoints are kept.

A save that fails because its filesystem is full (ENOSPC / EDQUOT anywhere in the error's chain — torch's
writer reports it as a bare RuntimeError —, or less than `LOW_SPACE_BYTES` free when it failed) removes its
partial directory and raises `NoSpaceForCheckpoint`; nothing else changes, so the previous checkpoint stays the
latest. The trainer treats a periodic one as an error event and goes on (`TrainerCheckpoints`). The disk a run
needs is about (keep_last + 1) checkpoints: the new one is complete before the oldest is pruned.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.config.schema import RunConfig

from engine.persist.atomic import fsync_path, fsync_tree, publish_dir

PREFIX = "global_step_"
MANIFEST = "manifest.json"
STATE = "state.json"
QUEUED = "queued.json"
IN_FLIGHT = "in_flight.json"
TRAINER_DIR = "trainer"
FORMAT = 1
LOW_SPACE_BYTES = 16 * 2**20
"""Free bytes under which a failed save counts as out of space whatever its error says."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used (the message says why, in one line)."""


class NoSpaceForCheckpoint(CheckpointError):
    """A save failed for lack of space; its partial directory was removed and nothing else changed."""


def out_of_space(err: BaseException, root: Path) -> bool:
    """Did `err` (a failed save under `root`) come from a full filesystem? (module docstring)"""
    seen: BaseException | None = err
    for _ in range(16):  # the cause / context chain (bounded: chains can loop)
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(root).free < LOW_SPACE_BYTES
    except OSError:
        return False


def checkpoint_root(cfg: RunConfig, run_dir: str | Path) -> Path:
    """`checkpoint.dir`, or `<run_dir>/checkpoints`."""
    return checkpoint_dir(cfg.checkpoint.dir, run_dir)


def checkpoint_dir(configured: str | None, run_dir: str | Path) -> Path:
    """`configured` (`checkpoint.dir`), or `<run_dir>/checkpoints`."""
    return Path(configured) if configured else Path(run_dir) / "checkpoints"


def step_of(path: Path) -> int | None:
    """The local step in a `global_step_<n>` name (None for anything else)."""
    name = path.name
    if not name.startswith(PREFIX) or not name[len(PREFIX):].isdigit():
        return None
    return int(name[len(PREFIX):])


def list_checkpoints(root: Path) -> list[Path]:
    """Published checkpoint directories under `root`, oldest first (temporary ones are not listed)."""
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir()]
    return [p for s, p in sorted((s, p) for s, p in found if s is not None)]


def write_checkpoint(root: Path, step: int, *, save_trainer: Callable[[Path], None] | None, state: dict[str, Any],
                     queued: list[dict[str, Any]], in_flight: list[dict[str, Any]], keep_last: int,
                     weights_from: Path | None = None) -> Path:
    """Write one checkpoint atomically and prune to `keep_last`; returns its final path. Without
    `save_trainer` it is light: `trainer/` linked from the checkpoint `weights_from`, or none (initial weights)."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in [*root.glob(f".tmp-{PREFIX}*"), *root.glob(f".old-{PREFIX}*")]:
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step}"
    tmp = root / f".tmp-{PREFIX}{step}-{os.getpid()}"
    tmp.mkdir()
    try:
        linked: dict[str, dict[str, Any]] = {}
        if save_trainer is not None:
            save_trainer(tmp / TRAINER_DIR)
        elif weights_from is not None:
            linked = _link_trainer(Path(weights_from), tmp / TRAINER_DIR)
        _write_json(tmp / STATE, {"format": FORMAT, **state})
        _write_json(tmp / QUEUED, queued)
        _write_json(tmp / IN_FLIGHT, in_flight)
        files = {rel: linked.get(rel) or _digest(tmp / rel) for rel in _files(tmp)}
        manifest: dict[str, Any] = {"format": FORMAT, "step": step, "files": files}
        if save_trainer is None:
            manifest["weights_from"] = str(weights_from) if weights_from is not None else "initial"
        _write_json(tmp / MANIFEST, manifest)
        fsync_tree(tmp)
        publish_dir(tmp, final)
    except BaseException as e:
        full = isinstance(e, Exception) and out_of_space(e, root)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise NoSpaceForCheckpoint(f"no space left for {final.name} under {root} ({type(e).__name__}: "
                                       f"{first}); its partial directory was removed") from e
        raise
    prune(root, keep_last)
    return final


def verify_checkpoint(path: Path) -> str | None:
    """None when `path` is a complete, intact checkpoint; else the reason it is not (one line)."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return "no manifest.json (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files: dict[str, dict[str, Any]] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"unreadable manifest.json ({type(e).__name__})"
    for required in (STATE, QUEUED, IN_FLIGHT):
        if required not in files:
            return f"the manifest does not list {required}"
    if manifest.get("weights_from") != "initial" and not any(rel.startswith(f"{TRAINER_DIR}/") for rel in files):
        return "the manifest lists no trainer state"
    for rel, want in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        size = f.stat().st_size
        if size != want.get("bytes"):
            return f"{rel} has {size} bytes, the manifest says {want.get('bytes')} (truncated?)"
        if _sha256(f) != want.get("sha256"):
            return f"{rel} does not match its sha256 checksum"
    return None


def latest_valid(root: Path, on_skip: Callable[[Path, str], None] | None = None) -> Path | None:
    """The newest intact checkpoint under `root`; every newer corrupt one is reported to `on_skip`."""
    for path in reversed(list_checkpoints(root)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        if on_skip is not None:
            on_skip(path, problem)
    return None


def read_checkpoint(path: Path) -> dict[str, Any]:
    """`{"state", "queued", "in_flight", "trainer_dir", "path"}` of a verified checkpoint."""
    problem = verify_checkpoint(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is corrupt: {problem}")
    state = json.loads((path / STATE).read_text())
    if state.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} has format {state.get('format')}, this asyncrl reads {FORMAT}")
    has_trainer = (path / TRAINER_DIR).is_dir()
    return {"state": state, "queued": json.loads((path / QUEUED).read_text()),
            "in_flight": json.loads((path / IN_FLIGHT).read_text()),
            "trainer_dir": str(path / TRAINER_DIR) if has_trainer else None, "path": str(path)}


def ledger_position(path: Path) -> dict[str, Any]:
    """`{"ledger_bytes", "ledger_sha256"}`: where the ledger ends now (fsynced first, so the lines the checkpoint
    counts survive a power cut before it is published) and a checksum of everything before, so
    a resume can cut it there and check that the run directory belongs to the checkpoint."""
    if path.exists():
        fsync_path(path)  # the ledger writes whole lines (line-buffered): they are all in the file to sync
    data = path.read_bytes() if path.exists() else b""
    return {"ledger_bytes": len(data), "ledger_sha256": hashlib.sha256(data).hexdigest()}


def set_aside_newer(root: Path, step: int) -> list[str]:
    """Rename checkpoints newer than `step` to `.abandoned-…` (a resume from an older one abandons their
    timeline: their ledger positions no longer describe the run directory). Returns the old names."""
    stamp = int(time.time())
    moved = []
    for p in list_checkpoints(root):
        s = step_of(p)
        if s is not None and s > step:
            p.rename(p.with_name(f".abandoned-{p.name}-{stamp}"))
            moved.append(p.name)
    return moved


def prune(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` published checkpoints."""
    ckpts = list_checkpoints(root)
    for p in ckpts[: max(0, len(ckpts) - max(1, keep_last))]:
        shutil.rmtree(p, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- helpers
def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, separators=(",", ":")))


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _digest(path: Path) -> dict[str, Any]:
    return {"sha256": _sha256(path), "bytes": path.stat().st_size}


def _link_trainer(src_ckpt: Path, dest: Path) -> dict[str, dict[str, Any]]:
    """Hard-link (or copy) `src_ckpt/trainer/` to `dest`; returns the source manifest's entries for them."""
    entries = json.loads((src_ckpt / MANIFEST).read_text())["files"]
    out: dict[str, dict[str, Any]] = {}
    for rel, digest in entries.items():
        if not rel.startswith(f"{TRAINER_DIR}/"):
            continue
        target = dest / rel[len(TRAINER_DIR) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src_ckpt / rel, target)
        except OSError:
            shutil.copy2(src_ckpt / rel, target)
        out[rel] = digest
    if not out:
        raise CheckpointError(f"{src_ckpt} has no trainer state to take the weights from")
    return out
