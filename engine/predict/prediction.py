"""Predict a layout's speed: run the loop's real cores in the costed simulator for a few versions and
measure a steady window.

The run is simulated for `warm + measure + tail` versions (a stream of exactly that many versions' prompts).
The first `warm` versions fill the pipeline and the last `tail` drain it (the stream ends), so the window is
the `measure` versions between. Over the window of duration T, with V versions and S local steps:

    version time  = T / V                     step time = T / S
    samples/s     = prompts trained / T       (a sample is one prompt with its n responses, as in verl)
    rollout idle  = 1 − Σ replica busy / (replicas · T)            (verl's fully_async/rollouter/idle_ratio)
    trainer idle  = 1 − (train compute + Σ sync pauses) / T        (verl's fully_async/trainer/idle_ratio:
                                                                    the wait for data over the step time)
    time to end   = (end of version `warm`) + (total versions − warm) · version time

On `device = "cpu"` the trainer and the rollout workers share the host's cores, which the simulator does not
see (it gives each its own device): the prediction is then the contention bound
T_cpu = max(T, Σ replica busy / slots + trainer busy) — the work done serially (a replica's slots are one
batch, so their summed busy time counts once per slot count). The idle ratios stay those of the
overlap (T): on shared cores a side slows down while the other computes rather than idling, and what it
waits for follows the dependencies (a rule chosen after the tiny-preset runs of the plan-validation study).

Baselines on the same accelerators: `sync` (asyncrl's mode = "sync": the same actors in turn) and
`colocated` (verl's colocate baseline: all accelerators generate, then all train — no training step starts while
a dispatch is in flight (`CostedScenario.exclusive`); the batch is split evenly
over the replicas at once, so slots do not matter, and the training cost scales as 1 / world).

On accelerators the plan adds `lending` (`engine.predict.lending`): the predicted gain of lending the trainer's
devices to rollout while it waits for data — modelled, not built (on CPU, `resources.elastic_cores` is built).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.loop.sim.costed import CostedScenario, CostedWorld
from engine.predict.costs import CostModel, Layout

WARM, MEASURE, TAIL = 2, 4, 2
RESOLUTION = 128
"""Decode steps a full-length response takes in the simulation (longer limits are simulated in chunks)."""


@dataclass
class Prediction:
    """One simulated layout."""

    label: str
    mode: str
    replicas: int
    rollout_world: int
    trainer_world: int
    trigger: int
    staleness: float
    version_time_s: float
    step_time_s: float
    samples_per_s: float
    trainer_idle_ratio: float
    rollout_idle_ratio: float
    staleness_hist: dict[int, int]
    sync_pause_s: float
    """Per version: from the trainer's sync request to the weights loaded on every replica."""
    sync_wait_s: float
    """The part of the pause spent waiting for running generations to stop at a token boundary."""
    time_to_end_s: float | None
    versions_simulated: int
    violations: list[str] = field(default_factory=list)
    cpu_contention: bool = False

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        return d


def quantum(layout: Layout, resolution: int) -> int:
    """Real tokens per simulated token: responses are simulated in at most `resolution` steps."""
    return max(1, math.ceil(layout.max_new_tokens / max(1, resolution)))


def scenario(layout: Layout, costs: CostModel, versions: int, seed: int = 0, resolution: int = RESOLUTION
             ) -> CostedScenario:
    """The costed scenario of `layout` for `versions` versions: the config values of its `LoopParams`
    (`LoopParams.for_versions`: V · N local steps, a stream of ⌈V · N · R / K⌋ prompts for a keep rate K), which
    the simulator turns back into LoopParams by the same construction, in simulated tokens of q real tokens each
    (q = `quantum`): every per-token cost is multiplied by q and every length divided by it (rounded up), so
    lengths and abort points are exact to q tokens.

    Deterministic mode: syncs wait for the loaded version's work (the cores do it) and a replica generates one
    group at a time (`Layout.seqs_per_call` = n). Dynamic sampling: a group's responses all score alike with
    probability 1 − K, and the trainer core drops it and pulls on. Multi-turn: the loop's turn limits, tool
    calls after `costs.tool_call_p` of the model turns, each `costs.tool_latency_s`."""
    q = quantum(layout, resolution)
    tok, step = costs.train_at(layout.trainer_world)
    k = max(1, layout.slots)  # a replica of k slots: k simulated replicas of seqs_per_call / k rows, each
    # stepping at a + k·b·rows (every slot advances once per step of the whole batch, k·rows rows)
    keep = costs.keep_rate if layout.loop.dynamic_sampling else 1.0
    lp = layout.loop.for_versions(versions, keep)
    rp, tp, agent = lp.rollout, lp.trainer, lp.rollout.agent

    def scaled(x: int | None) -> int | None:
        return None if x is None else math.ceil(x / q)

    return CostedScenario(
        seed=seed, n=rp.n, ppo_mini_batch_size=rp.required_samples, require_batches=1,
        trigger=rp.trigger, staleness_threshold=rp.staleness_threshold, partial_rollout=rp.partial_rollout,
        mode=lp.mode, max_staleness_versions=tp.max_staleness_versions, stale_policy=tp.stale_policy,
        deterministic=rp.deterministic, filter_groups=lp.dynamic_sampling, uniform_p=1.0 - keep,
        multi_turn=agent is not None, max_assistant_turns=agent.max_assistant_turns if agent else None,
        max_user_turns=agent.max_user_turns if agent else None,
        max_parallel_calls=agent.max_parallel_calls if agent else 1,
        max_tokens_per_turn=scaled(agent.max_tokens_per_turn) if agent else None,
        tool_call_p=costs.tool_call_p, tool_latency=costs.tool_latency_s, tool_tail=0.0,
        replicas=layout.replicas * k, seqs_per_call=max(rp.n, layout.seqs_per_call // k),
        total_prompts=lp.total_rollout_steps, total_steps=versions,
        max_new_tokens=math.ceil(layout.max_new_tokens / q), long_tail=costs.long_tail,
        token_cost=costs.decode_step_s * q, train_token_cost=tok * q, sync_cost=costs.sync_s,
        row_cost=costs.row_step_s * q * k, prefill_cost=costs.prefill_token_s * q,
        prompt_tokens=math.ceil(layout.prompt_tokens / q), train_step_overhead=step,
        short_max=max(1, math.ceil(min(costs.short_max, layout.max_new_tokens) / q)),
        exclusive=layout.colocated,
    )


def simulate(layout: Layout, costs: CostModel, label: str = "plan", measure: int = MEASURE,
             seed: int = 0, resolution: int = RESOLUTION) -> Prediction:
    """Simulate `layout` and measure its steady window (see the module docstring)."""
    total = layout.total_versions
    versions = WARM + measure + TAIL
    if total is not None and total <= versions:
        versions = total
    s = scenario(layout, costs, versions, seed, resolution)
    world = CostedWorld(s)
    out = world.run()
    marks = [m for m in world.marks if m.end > 0.0]
    if len(marks) >= versions and versions > WARM + TAIL:
        i, j = WARM - 1, versions - TAIL - 1
        a, b = marks[i], marks[j]
        t0, t1 = a.end, b.end
        span = marks[i + 1: j + 1]
        prompts0, prompts1 = a.prompts_trained, b.prompts_trained
        v, steps = b.version - a.version, b.local_step - a.local_step
        rbusy, tbusy = b.rollout_busy - a.rollout_busy, b.trainer_busy - a.trainer_busy
    else:  # a short run: all of it
        t0, t1, span = 0.0, out.sim_time, marks
        prompts0, prompts1 = 0, world.trained_prompts
        v, steps = max(1, out.versions), max(1, out.steps)
        rbusy, tbusy = out.rollout_busy_s, out.trainer_busy_s
    T = max(1e-12, t1 - t0)
    pauses = [m.end - m.begin for m in span]
    train_compute = tbusy - len(span) * s.sync_cost
    T_free = T
    cpu = layout.device == "cpu"
    if cpu:  # a replica's k slots step together in one batch: its busy time is the slots' ÷ k
        T = max(T, rbusy / max(1, layout.slots) + tbusy)
    hist = collections.Counter(out.staleness[prompts0:prompts1])
    version_time = T / max(1, v)
    if total is None:
        to_end = None
    elif versions == total:
        to_end = out.sim_time * (T / max(1e-12, t1 - t0))
    else:
        to_end = t0 * (T / max(1e-12, t1 - t0)) + (total - WARM) * version_time
    return Prediction(
        label=label, mode=layout.mode, replicas=layout.replicas, rollout_world=layout.rollout_world,
        trainer_world=layout.trainer_world, trigger=layout.trigger, staleness=layout.staleness,
        version_time_s=version_time, step_time_s=T / max(1, steps), samples_per_s=(prompts1 - prompts0) / T,
        trainer_idle_ratio=min(1.0, max(0.0, 1 - (train_compute + sum(pauses)) / T_free)),
        rollout_idle_ratio=min(1.0, max(0.0, 1 - rbusy / (layout.replicas * max(1, layout.slots) * T_free))),
        staleness_hist=dict(hist), sync_pause_s=sum(pauses) / max(1, len(pauses)),
        sync_wait_s=max(0.0, sum(pauses) / max(1, len(pauses)) - s.sync_cost),
        time_to_end_s=to_end, versions_simulated=versions, violations=list(out.violations), cpu_contention=cpu,
    )


def sync_layout(layout: Layout) -> Layout:
    """asyncrl's `mode = "sync"` on the same actors: the loop the same config builds in sync mode."""
    if layout.baseline is None and not layout.loop.sync_mode:
        raise ValueError(f"layout {layout.name!r} has no sync baseline: build it with Layout.from_config")
    return dataclasses.replace(layout, loop=layout.baseline or layout.loop)


def colocated_layout(layout: Layout) -> Layout:
    """verl's colocate baseline: every accelerator generates, then every accelerator trains."""
    replicas = max(1, layout.accelerators // layout.replica_gpus)
    per_version = layout.required_samples * layout.trigger
    per_call = min(layout.seqs_per_call, layout.n * math.ceil(per_version / replicas))
    return dataclasses.replace(sync_layout(layout), replicas=replicas, call_rows=max(layout.n, per_call),
                               trainer_world=layout.accelerators, slots=1, colocated=True)


def predict(layout: Layout, costs: CostModel, baselines: bool = True, measure: int = MEASURE,
            resolution: int = RESOLUTION) -> dict[str, Any]:
    """The plan of `layout` and, with `baselines`, its sync and colocated baselines and the speed-ups."""
    main = simulate(layout, costs, "plan", measure, resolution=resolution)
    out: dict[str, Any] = {"plan": main}
    if baselines:
        out["sync"] = simulate(sync_layout(layout), costs, "sync", measure, resolution=resolution)
        colo = colocated_layout(layout)
        if colo.device != "cpu":
            out["colocated"] = simulate(colo, costs, "colocated", measure, resolution=resolution)
        out["speedup_vs_sync"] = main.samples_per_s / out["sync"].samples_per_s
        if layout.device != "cpu":
            from engine.predict.lending import lending_gain

            out["lending"] = lending_gain(layout, main)
        if "colocated" in out:
            out["speedup_vs_colocated"] = main.samples_per_s / out["colocated"].samples_per_s
    return out
