"""What the `vllm` backend hands the engine for an image prompt (no vLLM needed): each image's expanded
placeholder run cut back to the one placeholder vLLM's multimodal processor expands itself (an expanded run would
grow from n to 2n − 1 there, `engine.rollout.vllm.backend`, "Images")."""

from __future__ import annotations

from engine.multimodal.placeholders import expand_image_tokens, image_runs
from engine.rollout.vllm.backend import collapse_image_placeholders

IMAGE, START, END = 6, 4, 5


def test_the_engine_gets_the_rendered_prompt_back_from_the_expanded_one() -> None:
    rendered = [3, 9, 10, START, IMAGE, END, 11, START, IMAGE, END, 12, 1, 3, 13]
    expanded = expand_image_tokens(rendered, IMAGE, [9, 4])
    assert image_runs(expanded, IMAGE) == [9, 4]
    assert collapse_image_placeholders(expanded, IMAGE) == rendered


def test_a_prompt_without_images_and_other_tokens_are_left_alone() -> None:
    ids = [3, 7, 7, 7, 8, 1]
    assert collapse_image_placeholders(ids, IMAGE) == ids
    assert collapse_image_placeholders([IMAGE], IMAGE) == [IMAGE]
