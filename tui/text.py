"""A run's own text, made safe to show: plain, bounded, with no control characters.

Every string a run sends (its name, its layers', host and job names, scalar names, end
reasons, evidence, anomaly and check reports, event messages) is untrusted input to the
screen: ``[/x.cc:1]`` is markup to Textual, ``\\x1b[2J`` is a command to the terminal, a
right-to-left override reorders the line, a lone surrogate cannot be written out, and a
100 kB name would be measured and cut at every frame. What the screen shows of a run
goes through ``plain_line`` (one line), ``plain_name`` (a name) or ``plain_block`` (a
report, its lines kept), and then into a ``rich.text.Text`` or ``markup=False``, never
into markup.

Pure Python (no textual, no rich): the widgets, the screens and ``tui.format`` use it.
"""

from __future__ import annotations

import re
import unicodedata

NAME_LIMIT = 200  # characters of a name (run, layer, host, job, scalar)
LINE_LIMIT = 400  # ... of a line (an end reason, an evidence value, a message)
BLOCK_LIMIT = 8000  # ... of a report (anomaly, check), over at most BLOCK_LINES lines
BLOCK_LINES = 200
ELLIPSIS = "…"

# Escape sequences are removed whole, so that no "[31m" is left behind: CSI (ESC [ or
# the 8-bit 0x9b), OSC, DCS, SOS, PM and APC strings (up to BEL or ST), and the
# two-character escapes.
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
)
# Control (Cc), format (Cf: bidirectional overrides, zero-width characters), surrogate
# (Cs) and separator (Zl, Zp) characters: nothing a terminal should receive from a run.
_DROPPED = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_SPACES = {"\t": " ", "\n": " ", "\r": " ", "\u2028": " ", "\u2029": " ", "\x0b": " ", "\x0c": " "}


def plain_line(value: object, limit: int = LINE_LIMIT) -> str:
    """``value`` as one line of plain text: escape sequences and control characters
    removed (tabs and line breaks become spaces), cut to ``limit`` characters (the last
    one an ellipsis)."""
    text = _head(value, limit)
    if not text.isprintable():  # (fast for the usual name: checked in C)
        text = _clean(text, keep_lines=False)
    return cut(text, limit)


def plain_name(value: object) -> str:
    """``plain_line`` bounded as a name (a run's, a layer's, a host's, a scalar's)."""
    return plain_line(value, NAME_LIMIT)


def plain_block(value: object, limit: int = BLOCK_LIMIT, max_lines: int = BLOCK_LINES) -> str:
    """``value`` as plain text of several lines (a report): as ``plain_line``, but line breaks
    kept, at most ``max_lines`` of them and ``limit`` characters in all."""
    text = _head(value, limit)
    if not text.isprintable():
        text = _clean(text, keep_lines=True)
    lines = text.split("\n")
    if len(lines) > max_lines:
        text = "\n".join([*lines[: max_lines - 1], ELLIPSIS])
    return cut(text, limit)


def cut(text: str, limit: int) -> str:
    """``text``, or its first ``limit - 1`` characters and an ellipsis."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + ELLIPSIS if limit > 0 else ""


def _head(value: object, limit: int) -> str:
    """The part of ``value`` that can matter once cleaned and cut: what a frame redraws
    costs the same for a 100 kB name as for a short one."""
    text = value if isinstance(value, str) else str(value)
    return text[: 4 * limit + 64]


def _clean(text: str, *, keep_lines: bool) -> str:
    text = _ESCAPES.sub("", text)
    if keep_lines:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    out = []
    for char in text:
        if char == "\n" and keep_lines:
            out.append(char)
        elif char in _SPACES:
            out.append(_SPACES[char])
        elif unicodedata.category(char) not in _DROPPED:
            out.append(char)
    return "".join(out)


SEPARATORS = "._/-:"  # where a layer's (or a run's) name divides into words


def shorten_middle(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: its start and its end around an
    ellipsis, the end kept as whole segments where they fit
    (``transformer.h.0.attn.c_proj`` in 20: ``transf…0.attn.c_proj``). The end says
    what a layer is and which block; the start, the model part it belongs to.

    Example:
        >>> shorten_middle("transformer.h.11.mlp.c_fc", 16)
        'transfo…mlp.c_fc'
    """
    if len(name) <= width:
        return name
    if width <= 1:
        return ELLIPSIS[:width]
    budget = width - 1  # what the ellipsis leaves
    head_min = budget // 3
    tail = _whole_segments_tail(name, budget - head_min)
    if not tail:  # not even the last segment fits: cut by characters
        tail = name[len(name) - (budget - budget // 3) :]
    head = name[: budget - len(tail)]
    return head + ELLIPSIS + tail


def _whole_segments_tail(name: str, room: int) -> str:
    """The longest end of ``name`` made of whole segments (it starts after a
    separator) in at most ``room`` characters; empty if even the last is longer."""
    best = ""
    for index in range(len(name) - 1, 0, -1):
        if name[index - 1] in SEPARATORS:
            if len(name) - index > room:
                break
            best = name[index:]
    return best


def cut_words(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, the last an ellipsis, cut after a
    word (a space or a name's separator: ``sigmoid-…``) where one falls in the last
    third of what is kept, else by characters."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return ELLIPSIS[:limit]
    head = text[: limit - 1]
    ends = [i + 1 for i, char in enumerate(head) if char == " " or char in SEPARATORS]
    if ends and ends[-1] >= (2 * len(head)) // 3:
        head = head[: ends[-1]]
    return head + ELLIPSIS
