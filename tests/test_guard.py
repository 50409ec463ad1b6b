"""The runner-wide guard (course_lib/course/grading/guard.py): what it refuses, what it lets by.

`tests/test_delegation.py` refuses a delegating submission of every exercise in eight ways;
this file pins the guard's own rules on a small made-up exercise, and the whole path
through `course grade` (a real kernel, where notebook cells have their own file names).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from course_lib.course.grading.checks import Exercise, assert_allclose, call, check_case, run_exercise
from course_lib.course.grading.guard import GUARD_DESCRIPTION, CallTracer


@check_case("doubles a vector")
def _doubles(fn):
    assert_allclose(call(fn, np.array([1.0, 2.0])), [2.0, 4.0], what="double(...)")


@check_case("doubles again")
def _again(fn):
    assert_allclose(call(fn, np.array([3.0])), [6.0], what="double(...)")


DOUBLE = Exercise("double", points=1, checks=(_doubles, _again), hints=("x * 2", "return 2 * x"), title="t")


def _define(source: str, name: str = "double"):
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    return namespace[name]


def test_own_code_passes_with_no_extra_check():
    outcome = run_exercise(DOUBLE, _define("def double(x):\n    return 2 * x\n"))
    assert outcome.passed and outcome.n_checks == 2


@pytest.mark.parametrize(
    "source",
    [
        # a computed module name: only the run-time tracer can see it
        "import importlib\ndef double(x):\n"
        "    m = importlib.import_module(''.join(['course_', 'lib.rl.pg']))\n"
        "    m.discounted_returns(np.zeros(1), np.zeros(1), 0.5)\n    return 2 * x\n",
        # a helper thread does the call
        "import threading, importlib\ndef double(x):\n    out = []\n"
        "    def work():\n        m = importlib.import_module(''.join(['course_', 'lib.rl.pg']))\n"
        "        out.append(m.discounted_returns(np.zeros(1), np.zeros(1), 0.5))\n"
        "    t = threading.Thread(target=work); t.start(); t.join()\n    return 2 * x\n",
        # handed to a library that makes the call (numpy here; torch.utils.checkpoint, jax.lax.scan alike)
        "import importlib\ndef double(x):\n"
        "    f = getattr(importlib.import_module(''.join(['course_', 'lib.rl.pg'])), 'discounted_returns')\n"
        "    np.apply_along_axis(f, 0, np.zeros((2, 1)), np.zeros(2), 0.5)\n    return 2 * x\n",
        # the library function is a thread's target, or a pool's task: no learner frame in that thread
        "import threading, importlib\ndef double(x):\n"
        "    f = getattr(importlib.import_module(''.join(['course_', 'lib.rl.pg'])), 'discounted_returns')\n"
        "    t = threading.Thread(target=f, args=(np.zeros(1), np.zeros(1), 0.5)); t.start(); t.join()\n"
        "    return 2 * x\n",
        "import importlib\nfrom concurrent.futures import ThreadPoolExecutor\ndef double(x):\n"
        "    m = importlib.import_module('_'.join(['course', 'lib.rl.pg']))\n"
        "    with ThreadPoolExecutor(1) as ex:\n"
        "        ex.submit(getattr(m, '_'.join(['discounted', 'returns'])), np.zeros(1), np.zeros(1), 0.5).result()\n"
        "    return 2 * x\n",
    ],
    ids=["computed_name", "in_a_thread", "through_a_library", "thread_target", "thread_pool"],
)
def test_a_call_into_course_lib_however_reached_is_refused_at_run_time(source):
    fn = _define("import numpy as np\n" + source)
    outcome = run_exercise(DOUBLE, fn)
    assert not outcome.passed
    assert [r.status for r in outcome.results] == ["fail", "skipped"]
    assert "double uses course_lib.rl.pg.discounted_returns, the library's own implementation" in outcome.message


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\nfrom concurrent.futures import ProcessPoolExecutor\ndef double(x):\n"
        "    m = importlib.import_module('_'.join(['course', 'lib.rl.pg']))\n"
        "    with ProcessPoolExecutor(1) as ex:\n"
        "        ex.submit(getattr(m, '_'.join(['discounted', 'returns'])), np.zeros(1), np.zeros(1), 0.5).result()\n"
        "    return 2 * x\n",
        "import multiprocessing as mp\ndef double(x):\n"
        "    p = mp.get_context('fork').Process(target=print, args=('hi',)); p.start(); p.join()\n"
        "    return 2 * x\n",
    ],
    ids=["process_pool", "a_process"],
)
def test_a_process_started_while_checked_is_refused(source):
    fn = _define("import numpy as np\n" + source)
    outcome = run_exercise(DOUBLE, fn)
    assert not outcome.passed
    assert [r.status for r in outcome.results] == ["fail", "skipped"]
    assert "double started a process (multiprocessing) while it was checked" in outcome.message
    # and the guard leaves multiprocessing as it found it
    import multiprocessing.process

    assert multiprocessing.process.BaseProcess.start.__module__ == "multiprocessing.process"


def test_a_static_reference_is_refused_before_any_check_and_names_what_to_write():
    exercise = Exercise("double", 1, (_doubles, _again), advice="with numpy only")
    fn = _define(
        "from course_lib.rl import pg\ndef double(x):\n    return 2 * x + 0 * pg.discounted_returns(x, x, 0.0)\n"
    )
    outcome = run_exercise(exercise, fn)
    assert [r.status for r in outcome.results] == ["fail", "skipped", "skipped"]
    assert outcome.results[0].description == GUARD_DESCRIPTION
    assert "write double yourself, with numpy only" in outcome.message


def test_a_program_in_a_string_that_imports_course_lib_is_refused_statically():
    # the subprocess route a reviewer found: the library run in a child process, out of the trace hook's sight
    fn = _define(
        "import json, subprocess, sys\n"
        "def double(x):\n"
        "    prog = 'import sys; from course_lib.rl.pg import discounted_returns; print(sys.argv)'\n"
        "    subprocess.run([sys.executable, '-c', prog], check=False, capture_output=True)\n"
        "    return 2 * x\n"
    )
    outcome = run_exercise(Exercise("double", 1, (_doubles, _again), advice="with numpy only"), fn)
    assert outcome.results[0].description == GUARD_DESCRIPTION and not outcome.passed
    assert "course_lib.rl.pg" in outcome.message
    # a string that only mentions a name like it is not code
    ok = _define("def double(x):\n    note = 'see course_lib_notes and numpy.linalg'\n    return 2 * x\n")
    assert run_exercise(Exercise("double", 1, (_doubles, _again), advice="with numpy only"), ok).passed


def test_allowed_pieces_fakes_and_dataclass_inits_are_not_refused():
    exercise = Exercise("double", 1, (_doubles,), allowed=("course_lib.layout.model.GPU",))
    source = (
        "from course_lib.layout.model import GPU\n"
        "def double(x):\n"
        "    GPU('g', memory_bytes=1.0, hbm_bytes_per_s=1.0, peak_flops=1.0)\n"
        "    return 2 * x\n"
    )
    assert run_exercise(exercise, _define(source)).passed
    # the same use without the allow-list is refused
    assert not run_exercise(Exercise("double", 1, (_doubles,)), _define(source)).passed


@pytest.mark.parametrize("how", ["pasted", "compiled_from_the_file"])
def test_a_copy_of_the_library_source_is_refused(how):
    """Pasting course_lib's function into the notebook, or compiling its file's source there,
    names no course_lib module and runs as the learner's code: its bytecode gives it away."""
    import inspect

    from course_lib.course.grading.lessons import get_exercise
    from course_lib.rl import pg

    if how == "pasted":  # with the imports its annotations and body need, as a learner would paste it
        source = "from __future__ import annotations\nimport numpy as np\n" + inspect.getsource(pg.discounted_returns)
    else:  # the library's whole module source, read from its file and run in the notebook
        source = (
            "import importlib.util, pathlib\n"
            "_spec = importlib.util.find_spec(''.join(['course_', 'lib.rl.pg']))\n"
            "_ns = {'__name__': '__main__'}\n"
            "exec(compile(pathlib.Path(_spec.origin).read_text(), '<mine>', 'exec'), _ns)\n"
            "def discounted_returns(rewards, dones, gamma, bootstrap=0.0):\n"
            "    return _ns['discounted_returns'](rewards, dones, gamma, bootstrap)\n"
        )
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<cell>", "exec"), namespace)
    outcome = run_exercise(get_exercise("00_welcome", "discounted_returns"), namespace["discounted_returns"])
    assert not outcome.passed
    # a copy compiled from the file is equal, as a code object, to the library's own (same lines)
    named = ("uses a copy of course_lib.rl.pg.discounted_returns", "uses course_lib.rl.pg.discounted_returns")
    assert any(n in outcome.message for n in named), outcome.message


def test_reading_a_property_of_a_course_lib_input_is_not_refused():
    from course_lib.envs.cartpole import EnvParams

    @check_case("reads the mass")
    def _mass(fn):
        assert_allclose(call(fn, EnvParams()), np.array([1.1]), what="mass(...)")

    source = "import numpy as np\ndef mass(params):\n    return np.array([float(params.total_mass)])\n"
    outcome = run_exercise(Exercise("mass", 1, (_mass,)), _define(source, "mass"))
    assert outcome.passed, outcome.message


def test_the_tracer_ignores_library_frames_and_restores_the_trace_function():
    import sys

    from course_lib.rl.pg import discounted_returns

    before = sys.gettrace()
    with CallTracer(()) as tracer:
        np.apply_along_axis(lambda row: row, 0, np.zeros((2, 2)))  # library code calling learner code
        discounted_returns(np.zeros(2), np.zeros(2), 0.5)  # this file is not under course_lib: a learner call
    assert sys.gettrace() is before and threading.gettrace() is None
    assert tracer.used == ["course_lib.rl.pg.discounted_returns"]


def test_a_host_callback_in_a_compiled_exercise_is_refused():
    import jax
    import jax.numpy as jnp

    @check_case("doubles under jit")
    def _jit(fn):
        got = np.asarray(jax.jit(lambda v: call(fn, v))(jnp.array([1.0, 2.0])))
        assert_allclose(got, [2.0, 4.0], what="double(...)")

    compiled = Exercise("double", 1, (_jit,), compiled=True)
    source = (
        "import jax, numpy as np\n"
        "def double(x):\n"
        "    return jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(x.shape, x.dtype), x)\n"
    )
    outcome = run_exercise(compiled, _define(source))
    assert not outcome.passed and "host callback" in outcome.message and "pure_callback" in outcome.message
    assert run_exercise(Exercise("double", 1, (_jit,)), _define(source)).passed  # allowed where not compiled


def test_a_delegating_notebook_scores_zero_through_course_grade(tmp_path, capsys):
    from test_grading_kernel import SECOND, grade, make_notebook

    cell = (
        "import importlib\n"
        "def discounted_returns(rewards, dones, gamma, bootstrap=0.0):\n"
        "    m = importlib.import_module(''.join(['course_', 'lib.rl.pg']))\n"
        "    return getattr(m, 'discounted_' + 'returns')(rewards, dones, gamma, bootstrap)\n"
    )
    path = make_notebook(tmp_path / "exercises" / "00_welcome.ipynb", cell, second=SECOND)
    g = grade(tmp_path, capsys, path)
    ex = g.exercise()
    assert not ex["passed"] and g.notebook()["score"] == 10  # the second exercise, solved, still scores
    assert "discounted_returns uses course_lib.rl.pg.discounted_returns, the library's own" in ex["message"]
