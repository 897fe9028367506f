"""Random scenarios for the loop simulator: a config within the schema's ranges, costs, faults and operator
actions, all drawn from one seed, so `asyncrl simulate --replay SEED` reproduces a run exactly (the budgets a
scenario runs under: `engine.loop.sim.bounds`).

A scenario = LoopParams + costs + faults. Its loop fields (n … filter_groups) are config values: `config()` writes
them into a `RunConfig` (the schema validates them) and `loop()` turns that into the cores' `LoopParams` through
`engine.loop.params.loop_params`, the function the run and `asyncrl plan` use — so the simulator checks the very
mapping a run starts from."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from engine.loop.dispatch import Capacity
from engine.loop.params import LoopParams, loop_params

if TYPE_CHECKING:
    from engine.config.schema import RunConfig


@dataclass
class Action:
    """An operator action at simulated time `at`: a knob (`trigger_parameter_sync_step`,
    `staleness_threshold`, `paused`) set to `value`, or `checkpoint` / `stop`."""

    at: float
    name: str
    value: Any = None


@dataclass
class Scenario:
    seed: int
    n: int = 2
    ppo_mini_batch_size: int = 2
    require_batches: int = 1
    trigger: int = 1
    staleness_threshold: float = 0.0
    partial_rollout: bool = True
    mode: str = "async"
    max_staleness_versions: int | None = None
    stale_policy: str = "drop"
    replicas: int = 1
    seqs_per_call: int = 4
    replica_rows: list[int] = field(default_factory=list)
    """Rows each replica runs at once (empty: `seqs_per_call` each)."""
    replica_calls: list[int] = field(default_factory=list)
    """Dispatches each replica takes at once (empty: 1 each, one batch per call)."""
    total_prompts: int = 32
    max_new_tokens: int = 16
    long_tail: float = 0.1
    """Probability that a response runs to the token limit (the long tail of lengths)."""
    token_cost: float = 0.01
    """Simulated seconds per decode step of a replica."""
    straggler: int | None = None
    """A replica whose decode steps cost 5× (None: none)."""
    train_token_cost: float = 0.001
    sync_cost: float = 0.05
    test_freq: int = 0
    val_prompts: int = 0
    val_before_train: bool = False
    checkpoint_every_versions: int = 0
    replica_deaths: list[float] = field(default_factory=list)
    max_replica_restarts: int = 3
    trainer_deaths: list[float] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    deterministic: bool = False
    """`trainer.deterministic`: syncs wait for the loaded version's work, batches in prompt order."""
    multi_turn: bool = False
    """Multi-turn rollouts (`RolloutParams.agent`): turns end with tool calls, the world runs the tools."""
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tokens_per_turn: int | None = None
    tool_call_p: float = 0.5
    """Probability that a model turn ends with tool calls (1-3 of them, sometimes a malformed one)."""
    tool_latency: float = 0.05
    """Median simulated seconds of a tool call (each call: × U(0.5, 1.5))."""
    tool_tail: float = 0.1
    """Probability that a call takes 20× as long (the long tail of tool latency)."""
    tool_timeout: float | None = None
    """A call still running after this long answers with a timeout error text instead (None: no timeout)."""
    tool_answer_tokens: int = 3
    """A tool answer renders to 1..2× this many tokens (an error text to 2)."""
    elastic_cores: bool = False
    """`resources.elastic_cores`: the world runs `engine.loop.elastic.ElasticCores` and applies its
    `SetThreads` at each role's next boundary (the checker bounds the threads in use)."""
    trainer_threads: int = 1
    """The plan's split: threads of the trainer (one rank) and of each replica."""
    replica_threads: int = 1
    filter_groups: bool = False
    """`algorithm.filter_groups` (dynamic sampling, metric "score"): the world scores each group, the trainer
    core drops the uniform ones and the rollouter samples replacements."""
    uniform_p: float = 0.0
    """Probability that a group's responses all score alike (dropped under `filter_groups`)."""
    total_steps: int | None = None
    """`trainer.total_steps` (policy versions; None: ⌊total_prompts / (required_samples · trigger)⌋, at least 1)."""

    @property
    def required_samples(self) -> int:
        return self.ppo_mini_batch_size * self.require_batches

    def config(self) -> RunConfig:
        """The run config of this scenario's loop fields (validated by the schema; model and data are the tiny
        built-ins, which the loop never reads)."""
        from engine.config.schema import RunConfig

        cycle = self.required_samples * self.trigger
        steps = self.total_steps if self.total_steps is not None else (1 if self.total_prompts < cycle else None)
        return RunConfig.model_validate({
            "name": f"sim-{self.seed}", "model": {"path": "builtin:tiny-qwen"},
            "data": {"train_files": ["builtin:copy"], "max_response_length": self.max_new_tokens},
            "trainer": {"ppo_mini_batch_size": self.ppo_mini_batch_size, "test_freq": self.test_freq,
                        "deterministic": self.deterministic, "total_steps": steps},
            "rollout": {"n": self.n, "max_num_seqs": self.seqs_per_call, "total_rollout_steps": self.total_prompts,
                        "multi_turn": {"enable": self.multi_turn, "max_assistant_turns": self.max_assistant_turns,
                                       "max_user_turns": self.max_user_turns,
                                       "max_parallel_calls": self.max_parallel_calls,
                                       "max_tokens_per_turn": self.max_tokens_per_turn}},
            "async_training": {"mode": "sync" if self.mode == "sync" else "fully_async",
                               "staleness_threshold": self.staleness_threshold,
                               "trigger_parameter_sync_step": self.trigger, "require_batches": self.require_batches,
                               "partial_rollout": self.partial_rollout,
                               "max_staleness_versions": self.max_staleness_versions,
                               "stale_policy": self.stale_policy},
            "checkpoint": {"every_versions": self.checkpoint_every_versions},
            "algorithm": {"filter_groups": {"enable": self.filter_groups, "metric": "score"}},
        })

    def loop(self) -> LoopParams:
        """The cores' parameters, by the run's own construction (`engine.loop.params.loop_params`)."""
        return loop_params(self.config(), self.total_prompts)

    def capacities(self) -> list[Capacity]:
        """Each replica's `Capacity` (rows at least `n`, as `RolloutLoop` makes them)."""
        return [Capacity(max(self.n, self.replica_rows[i] if i < len(self.replica_rows) else self.seqs_per_call),
                         max(1, self.replica_calls[i] if i < len(self.replica_calls) else 1))
                for i in range(self.replicas)]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def draw(seed: int, multi_turn: bool | None = None) -> Scenario:
    """A random scenario (small values on purpose: they hit the edge cases); `multi_turn` forces the
    multi-turn draw on or off (None: drawn, in about a third of the scenarios)."""
    r = random.Random(seed)
    s = Scenario(seed=seed)
    s.n = r.choice([1, 2, 3, 4])
    s.ppo_mini_batch_size = r.choice([1, 2, 3, 4])
    s.require_batches = r.choice([1, 1, 2, 3])
    s.trigger = r.choice([1, 1, 2, 3, 4, 6])
    s.staleness_threshold = r.choice([0.0, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0])
    s.partial_rollout = r.random() < 0.6
    s.mode = "sync" if r.random() < 0.15 else "async"
    if r.random() < 0.3:
        s.max_staleness_versions = r.choice([0, 0, 1, 2])
        s.stale_policy = r.choice(["drop", "wait"])
    s.replicas = r.choice([1, 1, 2, 3])
    s.seqs_per_call = max(s.n, r.choice([1, 2, 4, 8, 16]))
    s.max_new_tokens = r.choice([4, 16, 64])
    s.long_tail = r.choice([0.0, 0.1, 0.5])
    s.token_cost = r.choice([0.001, 0.01, 0.05])
    s.straggler = r.randrange(s.replicas) if s.replicas > 1 and r.random() < 0.2 else None
    s.train_token_cost = r.choice([0.0001, 0.001, 0.01])
    s.sync_cost = r.choice([0.0, 0.05, 0.5])
    cycle = s.required_samples * s.trigger
    s.total_prompts = min(240, cycle * r.randint(2, 8) + r.randint(0, s.required_samples))
    if r.random() < 0.4:
        s.val_prompts = r.choice([1, 3, 8])
        s.test_freq = r.choice([1, 2, 3])
        s.val_before_train = r.random() < 0.5
    if r.random() < 0.4:
        s.checkpoint_every_versions = r.choice([1, 2, 3])
    horizon = _work_estimate(s)
    if r.random() < 0.25:
        s.replica_deaths = sorted(r.uniform(0, horizon) for _ in range(r.randint(1, 3)))
        s.max_replica_restarts = r.choice([0, 2, 5])
    if r.random() < 0.2:
        s.trainer_deaths = sorted(r.uniform(0, horizon) for _ in range(r.randint(1, 2)))
    for _ in range(r.choice([0, 0, 1, 2, 4, 6])):
        at = r.uniform(0, horizon)
        kind = r.choice(["trigger_parameter_sync_step", "trigger_parameter_sync_step", "staleness_threshold",
                         "paused", "checkpoint", "stop"])
        if kind == "trigger_parameter_sync_step":
            s.actions.append(Action(at, kind, r.choice([1, 2, 3, 4, 8])))
        elif kind == "staleness_threshold":
            s.actions.append(Action(at, kind, r.choice([0.0, 0.5, 1.0, 3.0])))
        elif kind == "paused":  # a pause is always followed by a resume
            s.actions.append(Action(at, kind, True))
            s.actions.append(Action(at + r.uniform(0, horizon / 4), kind, False))
        elif kind == "stop" and r.random() < 0.5:
            s.actions.append(Action(at, kind))
        elif kind == "checkpoint":
            s.actions.append(Action(at, kind))
    s.actions.sort(key=lambda a: a.at)
    if r.random() < 0.6:  # streaming replicas of random capacities (drawn last: the fields above are as before)
        s.replica_calls = [r.choice([1, 2, 3, 4, 12]) for _ in range(s.replicas)]
        s.replica_rows = [r.choice([s.n, s.n + 1, 2 * s.n, 3 * s.n, s.seqs_per_call, 16, 64])
                          for _ in range(s.replicas)]
    if r.random() < 0.15:  # deterministic mode (drawn last: the fields above are as before)
        s.deterministic = True
        s.partial_rollout = False  # as `partial_rollout_in_force` makes it
        s.stale_policy = "drop"  # `validate` refuses "wait" in deterministic mode (determinism_checks.py)
    mt = r.random() < 0.35  # multi-turn (drawn last: the fields above are as before)
    if multi_turn if multi_turn is not None else mt:
        _draw_multi_turn(r, s)
    if r.random() < 0.5:  # elastic cores (drawn last: the fields above are as before)
        s.elastic_cores = True
        s.trainer_threads, s.replica_threads = r.choice([1, 1, 2, 3]), r.choice([1, 1, 2])
    if r.random() < 0.3 and not s.deterministic:  # dynamic sampling (drawn last; `validate` refuses it with
        s.filter_groups = True                     # deterministic mode)
        s.uniform_p = r.choice([0.0, 0.3, 0.7, 1.0])
    _draw_wide(r, s)  # drawn last: the fields above are as before
    return s


KNOBS = ("trigger_parameter_sync_step", "staleness_threshold", "paused")


def _knob_value(r: random.Random, name: str) -> Any:
    if name == "trigger_parameter_sync_step":
        return r.choice([1, 1, 2, 3, 4, 6, 8])
    if name == "staleness_threshold":
        return r.choice([0.0, 0.0, 0.25, 0.5, 1.0, 3.0])
    return r.random() < 0.5


def _draw_wide(r: random.Random, s: Scenario) -> None:
    """The wider space `--check` draws from, on top of the draw above: bursts of live knob changes (several
    knobs, some at one instant, a pause always resumed), deterministic mode together with multi-turn tools and
    with trainer and replica deaths, and faults and operator actions landing at the same instant."""
    horizon = _work_estimate(s)
    if r.random() < 0.35:  # a burst: 2-8 knob changes around one moment, some at the same instant
        center = r.uniform(0, horizon)
        burst = sorted((center if r.random() < 0.3 else max(0.0, center + r.uniform(-0.1, 0.3) * horizon),
                        r.choice(KNOBS)) for _ in range(r.randint(2, 8)))
        paused = False
        for at, name in burst:
            value = _knob_value(r, name)
            if name == "paused":
                if value == paused:
                    continue
                paused = value
            s.actions.append(Action(at, name, value))
        if paused:  # a pause is always followed by a resume
            s.actions.append(Action(burst[-1][0] + r.uniform(0, horizon / 3), "paused", False))
    if s.multi_turn and r.random() < 0.3:  # deterministic mode with tools (the cores support the pair)
        s.deterministic, s.partial_rollout, s.stale_policy = True, False, "drop"
        s.filter_groups = False
    if s.deterministic and r.random() < 0.5:  # ... and with deaths
        s.replica_deaths = sorted(s.replica_deaths + [r.uniform(0, horizon) for _ in range(r.randint(1, 2))])
        s.max_replica_restarts = max(s.max_replica_restarts, len(s.replica_deaths))
        if r.random() < 0.6:
            s.trainer_deaths = sorted(s.trainer_deaths + [r.uniform(0, horizon)])
    if r.random() < 0.15:  # a fault and an operator action at the same instant
        at = r.uniform(0, horizon)
        name = r.choice(["checkpoint", "trigger_parameter_sync_step", "staleness_threshold"])
        s.actions.append(Action(at, name, None if name == "checkpoint" else _knob_value(r, name)))
        if r.random() < 0.5:
            s.trainer_deaths = sorted(s.trainer_deaths + [at])
        else:
            s.replica_deaths = sorted(s.replica_deaths + [at])
    s.actions.sort(key=lambda a: a.at)


def _draw_multi_turn(r: random.Random, s: Scenario) -> None:
    """Small turn limits, tool latencies with a long tail, and timeouts (never in deterministic mode, which
    `validate` refuses with multi-turn: tool latencies decide when a turn is generated)."""
    s.multi_turn = True
    s.deterministic = False
    s.max_assistant_turns = r.choice([None, 1, 2, 3, 5])
    s.max_user_turns = r.choice([None, None, 1, 2, 4])
    s.max_parallel_calls = r.choice([1, 1, 2, 3])
    s.max_tokens_per_turn = r.choice([None, None, 1, 3, 8])
    s.tool_call_p = r.choice([0.2, 0.5, 0.8, 1.0])
    s.tool_latency = r.choice([0.0, 0.01, 0.1, 0.5])
    s.tool_tail = r.choice([0.0, 0.05, 0.2])
    s.tool_timeout = r.choice([None, None, 0.2, 1.0, 4.0])
    s.tool_answer_tokens = r.choice([1, 3, 8])


def _work_estimate(s: Scenario) -> float:
    """Rough simulated duration of the scenario's work, to place faults and actions inside it."""
    gen = s.total_prompts * s.n / max(1, s.replicas * s.seqs_per_call) * s.max_new_tokens * s.token_cost
    train = s.total_prompts * s.n * s.max_new_tokens * s.train_token_cost
    return max(1.0, gen + train)

