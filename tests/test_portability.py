"""``course portability``: the instruction-set switches really change the arithmetic, the
CPU hog really runs and leaves nothing behind, and a notebook whose output prints late
floating-point digits is caught while one printing a stable value passes."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import nbformat
import pytest

from course_lib.course import portability
from course_lib.course.cli import main as course_main
from course_lib.course.paths import repo_root

HAS_AVX2 = sys.platform == "linux" and " avx2" in Path("/proc/cpuinfo").read_text()


def test_isa_env_keeps_other_xla_flags_and_sets_every_switch():
    base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4 --xla_cpu_max_isa=AVX512", "PATH": "/bin"}
    env = portability.isa_env(base)
    assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=4", "--xla_cpu_max_isa=SSE4_2"]
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["ONEDNN_MAX_CPU_ISA"] == "SSE41" and env["PATH"] == "/bin"
    found = portability.numpy_dispatch_found()
    assert env.get("NPY_DISABLE_CPU_FEATURES", "").split() == found
    assert base["XLA_FLAGS"].endswith("AVX512")  # the input is not modified


@pytest.mark.skipif(not HAS_AVX2, reason="needs an x86-64 CPU with AVX2: the switches lower the ISA below it")
@pytest.mark.timeout(300)
def test_the_switches_change_bits_of_every_library_here():
    changed = portability.switch_effect()
    libraries = {op.split()[0] for op in changed}
    assert {"jax", "torch", "numpy"} <= libraries, changed  # each library's switch acts on this CPU
    assert "jax exp" in changed and "torch pow" in changed


def test_the_hog_runs_and_leaves_no_process():
    with portability.cpu_hog(2) as pids:
        time.sleep(0.5)
        busy = [float(Path(f"/proc/{pid}/stat").read_text().split()[13]) for pid in pids]  # utime, in ticks
        assert len(pids) == 2 and all(t > 0 for t in busy), busy
    time.sleep(0.2)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    with pytest.raises(ValueError, match="at least 1 process"), portability.cpu_hog(0):
        pass


def test_what_differed_keeps_the_diff_lines():
    message = "Cell 3\n\x1b[94mmismatch 'stdout'\x1b[0m\n\n assert reference_output == test_output failed:\n- a 1e-07\n+ a 2e-07\n? \n"
    assert portability.what_differed(message) == ["mismatch 'stdout'", "- a 1e-07", "+ a 2e-07", "? "]
    assert portability.what_differed("x\n" * 3 + "Traceback\nValueError: boom\n")[-1] == "ValueError: boom"


def _notebook(path: Path, cells: list[tuple[str, str]]) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for count, (source, text) in enumerate(cells, start=1):
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
    nbformat.write(nb, path)


@pytest.mark.skipif(not HAS_AVX2, reason="needs an x86-64 CPU with AVX2: the switches lower the ISA below it")
@pytest.mark.timeout(600)
def test_the_command_catches_late_digits_and_passes_stable_output(tmp_path, capsys):
    """Stored outputs from this process's kernels: the late digits of ``exp`` (numpy and
    JAX) differ under the isa variant, a rounded value does not; the report names the cell."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    digits = (
        f"{np.exp(x).astype(np.float64).sum():.17g} {np.asarray(jax.jit(jnp.exp)(x)).astype(np.float64).sum():.17g}"
    )
    late = (
        "import numpy as np, jax, jax.numpy as jnp\n"
        "x = np.linspace(-3, 3, 1001, dtype=np.float32)\n"
        'print(f"{np.exp(x).astype(np.float64).sum():.17g} {np.asarray(jax.jit(jnp.exp)(x)).astype(np.float64).sum():.17g}")'
    )
    stable = "import numpy as np\nprint(round(float(np.exp(np.linspace(-3, 3, 1001, dtype=np.float32)).sum()), 1))"
    stable_text = f"{round(float(np.exp(x).sum()), 1)}\n"
    bad, good = tmp_path / "late_digits.ipynb", tmp_path / "stable.ipynb"
    _notebook(bad, [(late, digits + "\n")])
    _notebook(good, [(stable, stable_text)])
    report = tmp_path / "report.json"
    code = course_main(["portability", str(bad), str(good), "--variants", "isa", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 1, out
    (result,) = json.loads(report.read_text())
    assert list(result["failures"]) == [f"{bad}::Cell 0"] and result["passed"] == 1, result
    assert f"DIFFERS  {bad}::Cell 0" in out and "1 cells differ or fail" in out
    assert "NPY_DISABLE_CPU_FEATURES" in out or not portability.numpy_dispatch_found()

    assert course_main(["portability", str(good), "--variants", "isa"]) == 0
    assert "no difference" in capsys.readouterr().out


def test_a_missing_notebook_is_named(capsys):
    assert course_main(["portability", "no/such.ipynb"]) == 2
    assert "no such notebook: no/such.ipynb" in capsys.readouterr().err


def test_every_course_notebook_is_in_the_default_list():
    root = repo_root()
    listed = portability.default_notebooks(root)
    assert len(listed) == len({*listed}) and all((root / p).is_file() for p in listed)
    assert {p.split("/")[0] for p in listed} == set(portability.NOTEBOOK_DIRS)
    assert len(listed) == sum(len(list((root / d).glob("*.ipynb"))) for d in portability.NOTEBOOK_DIRS)
    assert os.path.join("lessons", "00_welcome.ipynb") in listed
