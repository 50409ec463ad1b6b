"""The run contract: ``COURSE_SCALE`` is read here and nowhere else.

``cpu`` (default) is what the committed notebook outputs show and what CI verifies:
every notebook in at most 150 s on a 2-core CPU. ``full`` picks the sizes that show
the real effect on a GPU. Lessons take their sizes from :func:`pick`::

    n_episodes = pick(cpu=200, full=2_000)
"""

from __future__ import annotations

import os
from typing import Literal, TypeVar

Scale = Literal["cpu", "full"]
SCALES: tuple[Scale, ...] = ("cpu", "full")
ENV_VAR = "COURSE_SCALE"

T = TypeVar("T")


def current_scale() -> Scale:
    """The scale named by ``COURSE_SCALE`` (``cpu`` when unset).

    Raises:
        ValueError: naming the bad value and the valid ones.
    """
    value = os.environ.get(ENV_VAR, "cpu").strip().lower() or "cpu"
    if value not in SCALES:
        raise ValueError(
            f"{ENV_VAR}={value!r} is not a scale; use one of {', '.join(SCALES)} (e.g. `export {ENV_VAR}=cpu`)"
        )
    return value


def pick(*, cpu: T, full: T) -> T:
    """Return the value for the current scale."""
    return cpu if current_scale() == "cpu" else full
