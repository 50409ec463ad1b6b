"""What a lesson shows besides figures: progress on long work, and library code inline.

- :func:`progress` is a progress bar that leaves one plain summary line behind. In
  JupyterLab the learner sees a live bar while the work runs; when it ends, the bar is
  replaced by ``"<desc>: <n>/<total> <unit>s done"`` (the notebook's stored output reads
  well in any viewer, and is the same on every run, so nbval can compare it). Outside a
  kernel it is a tqdm bar on stderr.
- :func:`show_source` prints a course_lib function's source where the lesson explains
  it, so the code the learner reads is the code the lesson runs (one source of truth).
- :func:`describe` prints a config dataclass, one field per line with its help text.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Progress(Protocol):
    """What :func:`progress` yields: a counter the work advances."""

    def update(self, n: int = 1) -> None: ...


def in_kernel() -> bool:
    """True inside a Jupyter kernel (where widgets and rich displays render)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def summary_line(desc: str, n: int, total: int, unit: str) -> str:
    """The line a finished bar leaves behind (``"updates: 250/250 updates done"``)."""
    plural = unit if unit.endswith("s") or n == 1 else f"{unit}s"
    state = "done" if n >= total else "stopped early"
    return f"{desc}: {n}/{total} {plural} {state}"


@contextmanager
def progress(total: int, desc: str, unit: str = "step") -> Iterator[Progress]:
    """A progress bar over ``total`` units of work, replaced by a summary line at the end.

    Use it as ``with progress(250, "updates", unit="update") as bar: ... bar.update()``.
    If the work raises, the line says how far it got ("stopped early") and the error
    propagates.

    Raises:
        ValueError: if ``total`` is negative.
    """
    if total < 0:
        raise ValueError(f"progress total must be >= 0, got {total}")
    if not in_kernel():
        from tqdm import tqdm as text_bar

        with text_bar(total=total, desc=desc, unit=unit, file=sys.stderr) as bar:
            yield bar
        return

    from IPython.display import display, update_display
    from tqdm.notebook import tqdm as widget_bar

    bar = widget_bar(total=total, desc=desc, unit=unit, display=False)
    # The live bar's text form is already the line it will leave behind: a viewer without
    # widgets, and nbval (which does not apply display updates), read the same text as the
    # executed notebook stores, and no rates or times that change between runs.
    bundle = dict(bar.container._repr_mimebundle_())
    bundle["text/plain"] = summary_line(desc, total, total, unit)
    handle = display(bundle, raw=True, display_id=True)
    try:
        yield bar
    finally:
        n = int(bar.n)
        bar.close()
        # the widget's saved state (notebook metadata) keeps only what is the same on every run
        bar.container.children[-1].value = f"{n}/{total}"
        text = {"text/plain": summary_line(desc, n, total, unit)}
        update_display(text, raw=True, display_id=handle.display_id)


def show_source(obj: Callable[..., Any] | type) -> None:
    """Print the source of a course_lib function or class, as the lesson runs it.

    In a notebook the code is syntax-highlighted; its plain-text form (what nbval
    compares and what a plain viewer shows) is the source itself, so a lesson that shows
    code is re-verified whenever the library changes.
    """
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError) as err:
        raise TypeError(f"show_source needs a function or class defined in a .py file, got {obj!r}") from err
    header = f"# {obj.__module__}.{obj.__qualname__}\n"
    if in_kernel():
        from IPython.display import Code, display

        display(Code(header + source, language="python"))
    else:
        print(header + source, end="")


def describe(config: Any, exclude: Iterable[str] = ()) -> str:
    """A config dataclass as one line per field, ``name = value  # help``, the help text
    taken from each field's ``metadata["help"]``; ``exclude`` leaves fields out.

    Raises:
        TypeError: if ``config`` is not a dataclass instance.
    """
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError(f"describe needs a dataclass instance (a config), got {type(config).__name__}")
    skip = set(exclude)
    shown = [f for f in dataclasses.fields(config) if f.name not in skip]
    values = {f.name: repr(getattr(config, f.name)) for f in shown}
    name_w = max((len(f.name) for f in shown), default=0)
    value_w = min(max((len(v) for v in values.values()), default=0), 24)
    lines = []
    for f in shown:
        help_text = f.metadata.get("help", "")
        line = f"{f.name:<{name_w}} = {values[f.name]:<{value_w}}"
        lines.append(f"{line} # {help_text}" if help_text else line.rstrip())
    return "\n".join(lines)
