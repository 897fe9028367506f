"""`vllm_compat` reads each engine API from its signature (no vLLM needed): the calls the backend makes on the
seed-002 stack's vLLM 0.13 and on the pinned 0.32 differ exactly where those releases differ."""

from __future__ import annotations

import asyncio
from typing import Any

from engine.rollout.vllm.compat import EngineFeatures


class Engine013:
    """The 0.13 `AsyncLLM` signatures the backend uses."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def pause_generation(self, *, wait_for_inflight_requests: bool = False, clear_cache: bool = True) -> None:
        self.calls.append(("pause", {"wait_for_inflight_requests": wait_for_inflight_requests,
                                     "clear_cache": clear_cache}))

    async def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        self.calls.append(("reset", {"reset_running_requests": reset_running_requests}))
        return True


class Engine032(Engine013):
    renderer = type("R", (), {"render_cmpl": staticmethod(lambda raws: raws)})()

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:  # type: ignore[override]
        self.calls.append(("pause", {"mode": mode, "clear_cache": clear_cache}))

    async def release_kv_cache_memory(self) -> None:
        self.calls.append(("release", {}))


class EngineOld(Engine013):
    async def reset_prefix_cache(self) -> bool:  # type: ignore[override]
        self.calls.append(("reset", {}))
        return True


def test_the_pinned_vllm_keeps_natively_and_releases_the_kv_cache() -> None:
    engine = Engine032()
    f = EngineFeatures.of(engine)
    assert (f.pause_modes, f.release_kv_cache, f.reset_running, f.renderer) == (True, True, True, True)
    asyncio.run(f.pause(engine, "keep"))
    asyncio.run(f.reset_prefix_cache(engine))
    assert engine.calls == [("pause", {"mode": "keep", "clear_cache": False}),
                            ("reset", {"reset_running_requests": True})]


def test_vllm_0_13_pauses_by_aborting_and_the_backend_emulates_keep() -> None:
    engine = Engine013()
    f = EngineFeatures.of(engine)
    assert not f.keeps_natively and not f.release_kv_cache and f.reset_running and not f.renderer
    asyncio.run(f.pause(engine, "abort"))  # the backend calls "abort" for an emulated keep (after marking flights)
    assert engine.calls == [("pause", {"wait_for_inflight_requests": False, "clear_cache": False})]


def test_a_reset_without_the_running_requests_keyword_falls_back_to_the_plain_call() -> None:
    engine = EngineOld()
    f = EngineFeatures.of(engine)
    asyncio.run(f.reset_prefix_cache(engine))
    assert not f.reset_running and engine.calls == [("reset", {})]
