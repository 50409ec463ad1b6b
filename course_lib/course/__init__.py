"""Course tooling: what runs, checks and grades the lessons, apart from the RL library.

- ``scale``: the run contract (``COURSE_SCALE`` = ``cpu`` | ``full``), read in one place.
- ``paths``: where the checkout is and where runs may write.
- ``catalog``: the lesson map (ids, titles, status).
- ``display``: progress bars that leave one summary line, library source shown inline.
- ``notebooks``: build the ``.ipynb`` from the text sources, execute, check they are in sync.
- ``grading``: exercises' checks, the in-notebook self-check and ``course grade``.
- ``cli``, ``doctor``, ``lab``: the ``course`` command, the environment check, JupyterLab.

Lessons import the few names they need from ``course_lib`` itself
(``from course_lib import pick, progress``); everything else here is for the tooling.
"""
