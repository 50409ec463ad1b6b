"""Executed notebooks as Markdown pages for the course website (``course site``).

One function per step: a markdown cell's text (display math made its own paragraph),
a code cell (its source fenced and highlighted), and each output in the order a
notebook viewer prefers: an ipywidgets control becomes a note that it works in
JupyterLab, ``show_source`` code is highlighted as Python, figures are written next to
the page as image files, HTML is kept, text is fenced. No output is invented: a page
shows what the committed notebook holds.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
IMAGE_MIMES = {"image/png": "png", "image/jpeg": "jpg", "image/svg+xml": "svg"}
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NBVAL_MARKER = re.compile(r"^\s*# NBVAL_[A-Z_]+\s*$")
WIDGET_NOTE = (
    '!!! info "Interactive control: works in JupyterLab"\n'
    "    This cell builds an ipywidgets control, which needs a running Python kernel: open the\n"
    "    notebook in JupyterLab (`make lab`) to use it. {fallback}"
)
FALLBACK_BELOW = "On this page, the static figure below shows it at fixed settings."
FALLBACK_ELSEWHERE = "On this page, the lesson's static figures show the same model at fixed settings."


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (tracebacks, rich output)."""
    return _ANSI.sub("", text)


def fence(text: str, language: str = "text") -> str:
    """A fenced code block that no backtick run inside ``text`` can close early."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=2)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{language}\n{text.rstrip()}\n{ticks}"


def markdown_cell(source: str) -> str:
    """A markdown cell's text, with each ``$$ ... $$`` block that starts a line made its
    own paragraph (Jupyter renders it inside a paragraph; the site's math extension
    recognises display math only as a block)."""
    lines = source.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if not stripped.startswith("$$"):
            out.append(lines[i])
            i += 1
            continue
        end = i
        if not (len(stripped) >= 4 and stripped.endswith("$$")):
            end = i + 1
            while end < len(lines) and "$$" not in lines[end]:
                end += 1
        if out and out[-1].strip():
            out.append("")
        out.extend(lines[i : end + 1])
        out.append("")
        i = end + 1
    return "\n".join(out).strip()


def code_source(source: str) -> str:
    """A code cell's source as a highlighted Python block, without nbval's markers."""
    kept = [line for line in source.split("\n") if not _NBVAL_MARKER.match(line)]
    return fence("\n".join(kept).strip("\n"), "python") if any(line.strip() for line in kept) else ""


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _is_code_display(data: dict[str, Any]) -> bool:
    """IPython's ``Code`` display (what ``show_source`` shows): Pygments LaTeX beside HTML."""
    return _text(data.get("text/latex", "")).startswith("\\begin{Verbatim}") and "text/plain" in data


def output_markdown(
    output: dict[str, Any],
    save_image: Callable[[bytes, str], str],
    widget_fallback: str = FALLBACK_BELOW,
) -> str:
    """One cell output as Markdown.

    Args:
        output: a notebook output (``stream``, ``display_data``, ``execute_result`` or
            ``error``).
        save_image: writes an image's bytes with the given extension next to the page and
            returns the link to it, relative to the page.
        widget_fallback: the sentence that says where the page's static figure is.
    """
    kind = output.get("output_type")
    if kind == "stream":
        return fence(strip_ansi(_text(output.get("text", ""))))
    if kind == "error":
        lines = output.get("traceback") or [f"{output.get('ename')}: {output.get('evalue')}"]
        return fence(strip_ansi("\n".join(lines)))
    data: dict[str, Any] = output.get("data", {})
    if WIDGET_MIME in data:
        return WIDGET_NOTE.format(fallback=widget_fallback)
    if _is_code_display(data):
        return fence(_text(data["text/plain"]), "python")
    for mime, extension in IMAGE_MIMES.items():
        if mime in data:
            raw = _text(data[mime])
            payload = raw.encode() if mime == "image/svg+xml" else base64.b64decode(raw)
            return f"![figure]({save_image(payload, extension)})"
    if "text/html" in data:
        return f'<div class="nb-output" markdown="0">\n{_text(data["text/html"]).strip()}\n</div>'
    if "text/markdown" in data:
        return _text(data["text/markdown"])
    if "text/latex" in data:
        return f"$$\n{_text(data['text/latex']).strip().strip('$')}\n$$"
    if "text/plain" in data:
        return fence(strip_ansi(_text(data["text/plain"])))
    return ""


def _has_image(cell: dict[str, Any]) -> bool:
    return any(m in o.get("data", {}) for o in cell.get("outputs", []) for m in IMAGE_MIMES)


def notebook_markdown(
    notebook: dict[str, Any], image_dir: Path, link_prefix: str, with_outputs: bool = True
) -> tuple[str, int]:
    """A whole notebook as one Markdown page.

    Args:
        notebook: the notebook (nbformat 4, as a dict).
        image_dir: where figures are written (``fig_<cell>_<output>.<ext>``).
        link_prefix: the path from the page to ``image_dir``.
        with_outputs: False for an exercise statement (code only, no run outputs).

    Returns:
        The Markdown and the number of ipywidgets controls replaced by a note.
    """
    parts: list[str] = []
    widgets = 0
    cells = notebook["cells"]
    code_positions = [i for i, c in enumerate(cells) if c["cell_type"] == "code"]
    for index, cell in enumerate(cells):
        source = _text(cell.get("source", ""))
        if cell["cell_type"] == "markdown":
            parts.append(markdown_cell(source))
            continue
        if cell["cell_type"] != "code":
            continue
        parts.append(code_source(source))
        if not with_outputs:
            continue
        following = next((cells[i] for i in code_positions if i > index), None)
        fallback = FALLBACK_BELOW if following is not None and _has_image(following) else FALLBACK_ELSEWHERE
        for number, output in enumerate(cell.get("outputs", [])):

            def save(payload: bytes, extension: str, name: str = f"fig_{index:03d}_{number}") -> str:
                image_dir.mkdir(parents=True, exist_ok=True)
                (image_dir / f"{name}.{extension}").write_bytes(payload)
                return f"{link_prefix}/{name}.{extension}"

            rendered = output_markdown(output, save, fallback)
            widgets += WIDGET_MIME in output.get("data", {})
            parts.append(rendered)
    return "\n\n".join(p for p in parts if p.strip()) + "\n", widgets
