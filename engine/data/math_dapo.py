"""DAPO-Math's scorer, as verl's default reward computes it for `data_source = "math_dapo"` (and `aime*`):

    score = +1 if pred = truth else −1,   acc = [pred = truth]

over the last 300 characters of the response, with pred = the text after the last `Answer:` (case-insensitive,
to the end of its line; "[INVALID]" when there is none) and both sides put through the Minerva answer
normalisation (`normalize_final_answer`): keep what follows the last `=`; drop articles, spaces, `\\$`, units and
other listed words; unwrap `$…$`, `\\text{}`, `\\textbf{}`, `\\overline{}`, `\\boxed{}`; `\\fracab` → `\\frac{a}{b}`,
`\\sqrta` → `\\sqrt{a}`; thousands separators of a plain integer removed. The DAPO-Math prompts ask for the
final line `Answer: $Answer`.
"""

from __future__ import annotations

import re

TAIL_CHARS = 300
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_REPLACE = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
            (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
"""Substitutions, in order (Minerva's normalisation)."""
_DROP = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
         "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
         "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
         "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
         ",\\!", "{,}", '"', "\\dots")
"""Words and marks removed, in order (Minerva's normalisation)."""
_UNWRAP = ((re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"), (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
           (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"), (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
           (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"), (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
           (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"))


def normalize_final_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (see the module docstring)."""
    s = answer.split("=")[-1]
    for old, new in _REPLACE:
        s = s.replace(old, new)
    for word in _DROP:
        s = s.replace(word, "")
    for pattern, repl in _UNWRAP:
        s = pattern.sub(repl, s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def math_dapo(response_text: str, ground_truth: str, **_: object) -> dict[str, float | str]:
    """+1 / −1 with `acc` and verl's `pred` (the normalised answer; see the module docstring)."""
    found = _ANSWER.findall(response_text[-TAIL_CHARS:])
    pred = normalize_final_answer(found[-1] if found else "[INVALID]")
    acc = pred == normalize_final_answer(str(ground_truth))
    return {"score": 1.0 if acc else -1.0, "acc": float(acc), "pred": pred}
