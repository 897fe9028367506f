"""The built-in `figures` task: a geometry figure drawn with Pillow and a question with a numeric answer.

Every item is one figure (96 × 96 px, white, black strokes, labels in Pillow's default font) and one user
message `<image>QUESTION Answer with a number.` in verl's geo3k layout (the `<image>` marker stands for the
row's one image). The kinds, with the labelled quantities and the answer:

- `rect-perimeter` / `rect-area`: a rectangle with sides w, h ∈ 2..12 labelled → 2(w + h) / w·h;
- `square-perimeter`: a square with side s ∈ 2..15 labelled → 4s;
- `right-area`: a right triangle with legs a, b ∈ 2..12 labelled (a·b even) → a·b / 2;
- `angle`: a triangle with two angles A, B ∈ {20, 25, …, 80}° labelled → 180 − A − B;
- `circle-diameter`: a circle with radius r ∈ 1..25 labelled → 2r.

The item pool is the full enumeration (a few hundred items); `engine.data.builtin` permutes it with a seeded
RNG and splits it into validation and training items like the text tasks. Figures are deterministic: the
same item always gives the same pixels.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

QUESTION_SUFFIX = " Answer with a number."
SIZE = 96
QUESTIONS: dict[str, str] = {
    "rect-perimeter": "Find the perimeter of the rectangle.",
    "rect-area": "Find the area of the rectangle.",
    "square-perimeter": "Find the perimeter of the square.",
    "right-area": "Find the area of the right triangle.",
    "angle": "Find the unknown angle of the triangle in degrees.",
    "circle-diameter": "Find the diameter of the circle.",
}


@dataclass(frozen=True)
class Figure:
    """One item: its kind and the labelled quantities (meaning per kind, see the module docstring)."""

    kind: str
    a: int
    b: int = 0

    @property
    def answer(self) -> int:
        k, a, b = self.kind, self.a, self.b
        return {"rect-perimeter": 2 * (a + b), "rect-area": a * b, "square-perimeter": 4 * a,
                "right-area": a * b // 2, "angle": 180 - a - b, "circle-diameter": 2 * a}[k]

    @property
    def question(self) -> str:
        return QUESTIONS[self.kind] + QUESTION_SUFFIX


def all_figures() -> list[Figure]:
    """The whole item pool, in a fixed order."""
    items = [Figure(k, w, h) for k in ("rect-perimeter", "rect-area") for w in range(2, 13) for h in range(2, 13)]
    items += [Figure("square-perimeter", s) for s in range(2, 16)]
    items += [Figure("right-area", a, b) for a in range(2, 13) for b in range(2, 13) if a * b % 2 == 0]
    items += [Figure("angle", a, b) for a in range(20, 85, 5) for b in range(20, 85, 5)]
    items += [Figure("circle-diameter", r) for r in range(1, 26)]
    return items


def figure_messages(fig: Figure) -> list[dict[str, str]]:
    """The item's chat prompt: one user message, the image marker first."""
    return [{"role": "user", "content": f"<image>{fig.question}"}]


def render_png(fig: Figure) -> bytes:
    """The item's figure as PNG bytes (deterministic)."""
    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (SIZE, SIZE), "white")
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=12)
    k, a, b = fig.kind, fig.a, fig.b
    if k in ("rect-perimeter", "rect-area", "square-perimeter"):
        w, h = (a, b) if k != "square-perimeter" else (a, a)
        scale = 60 / max(w, h)
        pw, ph = max(8, round(w * scale)), max(8, round(h * scale))
        x0, y0 = (SIZE - pw) // 2, (SIZE - ph) // 2 + 4
        draw.rectangle((x0, y0, x0 + pw, y0 + ph), outline="black", width=2)
        draw.text((x0 + pw // 2 - 6, y0 - 16), str(w), fill="black", font=font)
        if k != "square-perimeter":
            draw.text((x0 + pw + 3, y0 + ph // 2 - 7), str(h), fill="black", font=font)
    elif k == "right-area":
        scale = 60 / max(a, b)
        pa, pb = max(8, round(a * scale)), max(8, round(b * scale))
        x0, y0 = 16, 16 + (60 - pb) // 2 + pb
        draw.polygon([(x0, y0), (x0 + pa, y0), (x0, y0 - pb)], outline="black", width=2)
        draw.rectangle((x0, y0 - 6, x0 + 6, y0), outline="black", width=1)
        draw.text((x0 + pa // 2 - 6, y0 + 2), str(a), fill="black", font=font)
        draw.text((x0 - 15, y0 - pb // 2 - 7), str(b), fill="black", font=font)
    elif k == "angle":
        draw.polygon([(6, 84), (90, 84), (36, 12)], outline="black", width=2)
        draw.text((14, 68), f"{a}°", fill="black", font=font)
        draw.text((50, 68), f"{b}°", fill="black", font=font)
        draw.text((33, 30), "?", fill="black", font=font)
    elif k == "circle-diameter":
        c, rad = SIZE // 2, 34
        draw.ellipse((c - rad, c - rad, c + rad, c + rad), outline="black", width=2)
        draw.line((c, c, c + rad, c), fill="black", width=2)
        draw.text((c + 6, c - 16), f"r={a}", fill="black", font=font)
    else:
        raise ValueError(f"unknown figure kind {k!r}")
    out = io.BytesIO()
    img.save(out, format="PNG", optimize=False)
    return out.getvalue()


def corpus_texts() -> list[str]:
    """Every question and answer string of the pool (for the tiny VL tokenizer)."""
    figs = all_figures()
    return sorted({f.question for f in figs} | {str(f.answer) for f in figs})
