"""Text for people: a long cause (a library's exception text, a value) shortened where a
word ends and said to be shortened, so a message keeps its own ending (what to do)."""

from __future__ import annotations


def shorten(text: object, limit: int = 300) -> str:
    """``text`` on one line, at most about ``limit`` characters: cut after a word, with how
    much was left out (never mid-word, never silently)."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    cut = flat.rfind(" ", 0, limit)
    head = flat[: cut if cut > limit // 2 else limit]
    return f"{head} ... [{len(flat) - len(head)} more characters]"
