"""End to end in a real browser: `make lab`'s server, lesson 00, its first code cell.

JupyterLab is started by ``course_lib.course.lab.serve_lab`` (the launch code of ``course lab``)
with fresh settings/workspace/runtime dirs; headless Chromium (the system one, driven
by Playwright for Python) opens lesson 00, waits for the kernel, clears the stored
outputs, runs the first code cell with Shift+Enter and checks what it renders.

Needs a Chromium executable (``chromium`` on PATH or /usr/bin/chromium): without one
the test is skipped, except under ``CI`` where it fails. Install it with
``sudo apt-get install chromium`` or ``.ci/install-browser``. Set
``COURSE_SCREENSHOT_DIR`` to keep the screenshot.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path

import psutil
import pytest
from chromium import CHROMIUM_ARGS, require_chromium

from course_lib.course.lab import free_port, lab_url, serve_lab
from course_lib.course.paths import repo_root

LESSON = "lessons/00_welcome.ipynb"
EXPECTED = "course_lib 0.1.0 | scale: cpu"
STDERR_MIME = "application/vnd.jupyter.stderr"
# seconds; together well under the test's 90 s budget (a run here takes ~15 s)
SERVER_START_S = 30
PAGE_LOAD_MS = 30_000
KERNEL_IDLE_MS = 30_000
CELL_RUN_MS = 30_000


def _isolated_lab(tmp: Path) -> tuple[list[str], dict[str, str]]:
    """Fresh JupyterLab settings/workspaces and Jupyter/IPython dirs under ``tmp``.

    Autosave is off so that running a cell never writes the lesson back to disk.
    """
    settings = tmp / "lab-user-settings"
    docmanager = settings / "@jupyterlab" / "docmanager-extension"
    docmanager.mkdir(parents=True)
    (docmanager / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    # no news or update settings here: the test sees the prompts a learner's `make lab` would show
    extra_args = [
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp / 'lab-workspaces'}",
    ]
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
        JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
        JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
        IPYTHONDIR=str(tmp / "ipython"),
        COURSE_SCALE="cpu",
    )
    return extra_args, env


def run_first_code_cell(chromium: str, root: Path, notebook: str, tmp: Path, expected: str) -> dict:
    """Open ``notebook`` (relative to ``root``) in JupyterLab in headless Chromium, run
    its first code cell and check it renders ``expected`` with no stderr or error.

    Returns timings and the screenshot path. The server and all its descendants
    (kernels) are gone when this returns, also on failure.
    """
    from playwright.sync_api import expect, sync_playwright

    timings: dict[str, float] = {}
    t0 = time.monotonic()
    screenshot = tmp / (Path(notebook).stem + ".png")
    log_path = tmp / "jupyterlab.log"
    extra_args, env = _isolated_lab(tmp)
    descendants: list[psutil.Process] = []
    process = None
    try:
        with serve_lab(
            port=free_port(),
            extra_args=extra_args,
            root_dir=root,
            env=env,
            log_path=log_path,
            log_level="INFO",
            startup_timeout=SERVER_START_S,
        ) as (url_base, token, process):
            timings["server_ready"] = time.monotonic() - t0
            with sync_playwright() as pw:
                context = pw.chromium.launch_persistent_context(
                    str(tmp / "chromium-profile"),  # fresh user-data dir
                    executable_path=chromium,
                    headless=True,
                    args=CHROMIUM_ARGS,
                    viewport={"width": 1400, "height": 900},
                    timeout=30_000,
                )
                try:
                    page = context.pages[0] if context.pages else context.new_page()
                    page_errors: list[str] = []
                    page.on("pageerror", lambda e: page_errors.append(str(e)))
                    try:
                        _drive(page, expect, lab_url(url_base, token, notebook), expected, timings, t0)
                    finally:
                        page.screenshot(path=str(screenshot))
                finally:
                    context.close()
            # every process the server started, kernels included (they run in their own
            # sessions, so killing the server's group alone would orphan them)
            descendants = psutil.Process(process.pid).children(recursive=True)
    except Exception as e:
        tail = log_path.read_text(errors="replace").splitlines()[-25:] if log_path.exists() else []
        e.add_note(f"screenshot: {screenshot}\n--- JupyterLab log ---\n" + "\n".join(tail))
        raise
    finally:
        keep = os.environ.get("COURSE_SCREENSHOT_DIR")
        if keep and screenshot.exists():
            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy2(screenshot, Path(keep) / screenshot.name)

    assert process is not None and process.poll() is not None, "JupyterLab still running"
    assert descendants, "the server had no kernel process: did the notebook start one?"
    left = [p for p in descendants if _alive(p)]
    assert not left, f"orphans after shutdown: {[(p.pid, p.cmdline()) for p in left]}"
    timings["total"] = time.monotonic() - t0
    return {"timings": timings, "screenshot": screenshot, "page_errors": page_errors}


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _drive(page, expect, url: str, expected: str, timings: dict, t0: float) -> None:
    page.goto(url, wait_until="domcontentloaded", timeout=PAGE_LOAD_MS)
    panel = page.locator(".jp-NotebookPanel:visible")
    expect(panel.locator(".jp-CodeCell").first).to_be_visible(timeout=PAGE_LOAD_MS)
    timings["notebook_shown"] = time.monotonic() - t0

    # the file browser (opened on lessons/) lists each lesson once: the notebook, not its text source
    listing = page.locator(".jp-DirListing-item .jp-DirListing-itemText")
    expect(listing.filter(has_text="00_welcome.ipynb")).to_have_count(1, timeout=PAGE_LOAD_MS)
    names = listing.all_inner_texts()
    stems = [Path(n.strip()).stem for n in names]
    assert len(stems) == len(set(stems)), f"a lesson is listed twice in the file browser: {names}"
    assert not [n for n in names if n.strip().endswith(".py")], f"text sources shown: {names}"

    # the kernel named by the notebook is up and idle
    indicator = panel.locator(".jp-Notebook-ExecutionIndicator")
    expect(indicator).to_have_attribute("data-status", "idle", timeout=KERNEL_IDLE_MS)
    expect(page.locator(".jp-StatusBar-TextItem", has_text="| Idle")).to_be_visible(timeout=KERNEL_IDLE_MS)
    timings["kernel_idle"] = time.monotonic() - t0

    # clear the committed outputs so what we check is what this run printed
    page.locator(".lm-MenuBar-item", has_text="Edit").click()
    page.get_by_role("menuitem", name="Clear Outputs of All Cells").click()
    cell = panel.locator(".jp-Notebook .jp-CodeCell").first
    expect(cell.locator(".jp-OutputArea-output")).to_have_count(0, timeout=5_000)

    # select the first code cell and run it the way a student does
    cell.locator(".jp-InputArea-editor").click()
    expect(cell).to_have_class(re.compile(r"\bjp-mod-selected\b"))
    page.keyboard.press("Shift+Enter")

    prompt = cell.locator(".jp-InputArea-prompt")
    expect(prompt).to_have_text(re.compile(r"^\[\d+\]:$"), timeout=CELL_RUN_MS)  # not [*]
    output = cell.locator(".jp-OutputArea-output")
    expect(output.first).to_contain_text(expected, timeout=CELL_RUN_MS)
    expect(indicator).to_have_attribute("data-status", "idle", timeout=CELL_RUN_MS)
    timings["cell_done"] = time.monotonic() - t0

    stderr = cell.locator(
        f'.jp-RenderedText[data-mime-type="{STDERR_MIME}"], .jp-OutputArea-output[data-mime-type="{STDERR_MIME}"]'
    )
    texts = output.all_inner_texts()
    assert stderr.count() == 0, f"the cell wrote to stderr or raised: {texts}"
    assert not any(re.search(r"Traceback|\b\w*Error\b:", t) for t in texts), texts
    # nothing asks the learner about Jupyter news or updates (the prompt comes a few seconds after load)
    news = page.get_by_text(re.compile(r"official Jupyter news|new version of JupyterLab", re.I))
    assert news.count() == 0, f"a news or update prompt is shown: {news.all_inner_texts()}"
    page.mouse.move(0, 0)  # no hover tooltips in the screenshot


@pytest.mark.timeout(90)
def test_lesson00_first_cell_runs_in_browser(tmp_path):
    chromium = require_chromium()
    root = repo_root()
    lesson = root / LESSON
    assert lesson.exists(), f"{LESSON} is missing: build it with `course build`"
    before = hashlib.sha256(lesson.read_bytes()).hexdigest()

    result = run_first_code_cell(chromium, root, LESSON, tmp_path, EXPECTED)

    print(f"\nbrowser test timings (s): {result['timings']}; screenshot: {result['screenshot']}")
    assert result["screenshot"].stat().st_size > 10_000, "screenshot is (nearly) empty"
    assert hashlib.sha256(lesson.read_bytes()).hexdigest() == before, f"{LESSON} was modified"
