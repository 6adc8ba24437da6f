"""Template problem statements: describe the failing behaviour from test names and assertion messages only.

They never mention the modified file, function, line or operator: the agent must localize the bug itself.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence

_TITLES = (
    "{subject} no longer behaves as expected",
    "Regression: {subject} gives wrong results",
    "Bug: {subject} is broken",
    "Unexpected behaviour in {subject}",
)
_INTROS = (
    "After a recent change, some behaviour of this project is broken.",
    "I'm seeing wrong results from the library.",
    "Something regressed: behaviour that used to work now fails.",
)
_MAX_MESSAGE = 240


def humanize_test(node_id: str) -> str:
    """`tests/test_text.py::TestX::test_parse_pairs_flag[a-1]` -> `parse pairs flag (a-1)`."""
    name = node_id.split("::")[-1]
    params = ""
    if "[" in name and name.endswith("]"):
        name, params = name[:-1].split("[", 1)
    name = re.sub(r"^test_?", "", name).replace("_", " ").strip() or name
    return f"{name} ({params})" if params else name


def _subject(f2p: Sequence[str]) -> str:
    words: dict[str, int] = {}
    for t in f2p:
        for w in humanize_test(t).split(" (")[0].split():
            if len(w) > 2:
                words[w] = words.get(w, 0) + 1
    if not words:
        return "the library"
    top = sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
    return f"`{top}`"


def problem_statement(
    f2p: Sequence[str], messages: Mapping[str, str], n_p2p: int, rng: random.Random, max_listed: int = 6
) -> str:
    subject = _subject(f2p)
    lines = [
        rng.choice(_TITLES).format(subject=subject),
        "",
        rng.choice(_INTROS),
        "",
        "The following behaviour is broken:",
    ]
    for t in list(f2p)[:max_listed]:
        msg = messages.get(t, "").replace("\n", " ")
        if len(msg) > _MAX_MESSAGE:
            msg = msg[:_MAX_MESSAGE] + "…"
        lines.append(f"- {humanize_test(t)}" + (f": fails with `{msg}`" if msg else ": fails"))
    if len(f2p) > max_listed:
        lines.append(f"- … and {len(f2p) - max_listed} more")
    lines += [
        "",
        "Expected: these cases work as documented"
        + (f", without breaking the {n_p2p} behaviours that still work today." if n_p2p else "."),
    ]
    return "\n".join(lines) + "\n"
