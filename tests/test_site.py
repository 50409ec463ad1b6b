"""The course website (``course site``): built from the repository, opened in a real browser.

The session fixture builds the site once into a temporary folder; the browser test serves
it on a local port (``course_lib.course.site.serve``, a thread in this process) and opens
every page in headless Chromium (the system one, driven by Playwright, as in
test_browser.py). Each page must load without console errors and without a single
request leaving the local server, carry the right title and first heading, load every
figure, typeset every formula (no raw ``$$`` left), and link only to pages that exist;
lessons link to the next one in order, and ipywidgets controls are replaced by a note and
a static figure. Screenshots of the home page and one lesson are kept in
``outputs/site-test/`` for a person to look at.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin

import pytest
from chromium import CHROMIUM_ARGS, require_chromium

from course_lib.course.catalog import get_lesson
from course_lib.course.paths import output_dir
from course_lib.course.site import (
    SITE_NAME,
    SiteError,
    SitePages,
    build_site,
    check_executed,
    page_title,
    serve,
)
from course_lib.course.site_markdown import WIDGET_MIME, fence, markdown_cell, output_markdown
from course_lib.runtime.processes import live_children, wait_gone

PAGE_LOAD_MS = 20_000
MATH_MS = 20_000  # MathJax's first typeset of a long lesson on a loaded 2-core machine
SEARCH_MS = 10_000
SCREENSHOTS = ("index.html", "lessons/02_importance_sampling.html")
# set by the site's MathJax config when the first typeset is over
MATHJAX_DONE = "() => document.body.dataset.mathjax === 'done'"
# text of the article outside code and MathJax's own elements: raw TeX left here was not typeset
RAW_TEXT = """() => {
  const copy = document.querySelector('article').cloneNode(true);
  copy.querySelectorAll('pre, code, script, mjx-container').forEach(e => e.remove());
  return copy.textContent;
}"""
# arithmatex elements MathJax did not turn into math, or typeset as an error
UNTYPESET = """() => [...document.querySelectorAll('.arithmatex')]
  .filter(e => !e.querySelector('mjx-container') || e.querySelector('mjx-merror'))
  .map(e => e.textContent.slice(0, 80))"""
IMAGES = "() => [...document.querySelectorAll('article img')].map(i => [i.currentSrc, i.complete, i.naturalWidth])"


# --------------------------------------------------------------------------- the build


@pytest.fixture(scope="session")
def built_site(tmp_path_factory) -> tuple[Path, SitePages, float]:
    """The site built once for the session: its folder, its pages and the build seconds."""
    folder = tmp_path_factory.mktemp("course-site")
    start = time.monotonic()
    pages = build_site(folder / "site", folder / "site_src")
    return folder / "site", pages, time.monotonic() - start


def test_unexecuted_notebook_stops_the_build_by_name(tmp_path):
    blank = tmp_path / "05_blank.ipynb"
    blank.write_text(json.dumps({"cells": [{"cell_type": "code", "source": "1", "outputs": [], "metadata": {}}]}))
    ran = tmp_path / "06_ran.ipynb"
    cell = {"cell_type": "code", "source": "1", "execution_count": 1, "metadata": {}}
    ran.write_text(json.dumps({"cells": [cell | {"outputs": [{"output_type": "execute_result", "data": {}}]}]}))
    check_executed([ran])
    with pytest.raises(SiteError, match=r"05_blank\.ipynb \(not executed") as info:
        check_executed([ran, blank, tmp_path / "07_gone.ipynb"])
    assert "07_gone.ipynb (missing)" in str(info.value) and "06_ran" not in str(info.value)


def test_display_math_becomes_its_own_block():
    text = "The return\n$$G_t = r_t\n  + \\gamma G_{t+1}$$\nis recursive; inline $x$ stays."
    assert markdown_cell(text) == "The return\n\n$$G_t = r_t\n  + \\gamma G_{t+1}$$\n\nis recursive; inline $x$ stays."


def test_outputs_render_as_a_viewer_would():
    assert fence("a ``` b").startswith("````text\n")
    widget = {"output_type": "display_data", "data": {WIDGET_MIME: {}, "text/plain": "interactive(...)"}}
    assert "works in JupyterLab" in output_markdown(widget, lambda payload, ext: "unused")
    error = {"output_type": "error", "ename": "E", "evalue": "v", "traceback": ["\x1b[31mE\x1b[0m: v"]}
    assert output_markdown(error, lambda payload, ext: "") == "```text\nE: v\n```"


def test_site_has_every_available_lesson(built_site):
    site, pages, seconds = built_site
    print(f"\nsite build: {seconds:.1f} s, {len(pages.lessons)} lessons, {len(pages.exercises)} exercise pages")
    assert pages.lessons and pages.lessons[0].id == "00_welcome"
    for lesson in pages.lessons:
        assert (site / "lessons" / f"{lesson.id}.html").exists()
        assert (site / "src" / "lessons" / f"{lesson.id}.ipynb").exists()
    assert (site / "search" / "search_index.json").exists(), "no search index"
    assert (site / "mathjax" / "tex-chtml.js").exists(), "MathJax is not bundled"


# --------------------------------------------------------------------------- the browser


def _page_paths(pages: SitePages) -> list[str]:
    return (
        ["index.html", "setup.html", "benchmarks.html", "instructors.html", "exercises/index.html"]
        + [f"lessons/{lesson.id}.html" for lesson in pages.lessons]
        + [f"exercises/{lesson.id}.html" for lesson in pages.exercises]
    )


def _expected_titles(path: str) -> tuple[str, str]:
    """(the browser tab's title, what the first heading starts with) for a page."""
    if path.startswith(("lessons/", "exercises/0", "exercises/1")):
        lesson = get_lesson(Path(path).stem)
        prefix = "" if path.startswith("lessons/") else "Exercises "
        return f"{page_title(lesson)} - {SITE_NAME}", f"{prefix}{lesson.number:02d} ·"
    fixed = {
        "index.html": (SITE_NAME, SITE_NAME),
        "setup.html": (f"Setup - {SITE_NAME}", "Setup"),
        "benchmarks.html": (f"Benchmarks - {SITE_NAME}", "Benchmarks"),
        "instructors.html": (f"Instructors - {SITE_NAME}", "Instructor's guide"),
        "exercises/index.html": (f"How grading works - {SITE_NAME}", "Exercises and grading"),
    }
    return fixed[path]


def _check_page(page, base: str, path: str, site: Path, pages: SitePages, links: set[str]) -> list[str]:
    """Open one page and return what is wrong with it (empty when all is right)."""
    problems: list[str] = []
    response = page.goto(base + path, wait_until="load", timeout=PAGE_LOAD_MS)
    if response is None or not response.ok:
        return [f"HTTP {response.status if response else 'no response'}"]
    page.wait_for_function(MATHJAX_DONE, timeout=MATH_MS)

    title, heading = _expected_titles(path)
    if page.title() != title:
        problems.append(f"title {page.title()!r} != {title!r}")
    h1 = page.locator("article h1").first.inner_text(timeout=5_000).rstrip("¶").strip()
    if not h1.startswith(heading):
        problems.append(f"first heading {h1!r} does not start with {heading!r}")

    images = page.evaluate(IMAGES)
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    if broken:
        problems.append(f"figures not loaded: {broken}")
    if path.startswith("lessons/"):
        figures = len(list((site / "lessons" / Path(path).stem).glob("fig_*")))
        if len(images) < figures:
            problems.append(f"{len(images)} images shown, {figures} figures in the notebook")

    raw = page.evaluate(RAW_TEXT)
    if "$$" in raw or "\\(" in raw or "\\[" in raw:
        at = max(raw.find("$$"), raw.find("\\("), raw.find("\\["))
        problems.append(f"math not typeset: ...{raw[max(0, at - 60) : at + 60]!r}")
    untypeset = page.evaluate(UNTYPESET)
    if untypeset:
        problems.append(f"{len(untypeset)} formulas not typeset, first: {untypeset[0]!r}")

    lesson_id = Path(path).stem
    widgets = pages.widgets.get(lesson_id, 0) if path.startswith("lessons/") else 0
    notes = page.locator(".admonition", has_text="works in JupyterLab").count()
    if notes != widgets:
        problems.append(f"{notes} notes for {widgets} ipywidgets controls")
    if widgets and not images:
        problems.append("an interactive lesson without a static figure")

    if path.startswith("lessons/"):
        order = [f"lessons/{lesson.id}.html" for lesson in pages.lessons]
        position = order.index(path)
        if position + 1 < len(order):
            following = page.locator("a.md-footer__link--next").get_attribute("href", timeout=5_000) or ""
            if urljoin(base + path, following) != base + order[position + 1]:
                problems.append(f"'next' links to {following!r}, not {order[position + 1]!r}")
        sources = page.locator(".nb-links a").evaluate_all("links => links.map(a => a.href)")
        if not any(s.endswith(".ipynb") for s in sources) or not any(s.endswith(".py") for s in sources):
            problems.append(f"no link to the notebook and its text source: {sources}")

    for href in page.locator("a[href]").evaluate_all("links => links.map(a => a.href)"):
        url = urldefrag(href).url
        if url.startswith(base):
            links.add(url)
    return problems


def _dead_links(links: set[str]) -> list[str]:
    dead = []
    for url in sorted(links):
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                if reply.status != 200:
                    dead.append(f"{url} ({reply.status})")
        except OSError as e:
            dead.append(f"{url} ({e})")
    return dead


def _search_finds(page, base: str, query: str) -> int:
    page.goto(base + "index.html", wait_until="load", timeout=PAGE_LOAD_MS)
    page.locator("input.md-search__input").fill(query, timeout=5_000)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=SEARCH_MS)
    return results.count()


@pytest.mark.timeout(300)
def test_every_page_in_a_browser(built_site):
    chromium = require_chromium()
    from playwright.sync_api import sync_playwright

    site, pages, build_s = built_site
    shots = output_dir() / "site-test"
    shots.mkdir(parents=True, exist_ok=True)
    before = {p.pid for p in live_children()}
    problems: dict[str, list[str]] = {}
    foreign: list[str] = []
    console: list[str] = []
    links: set[str] = set()
    start = time.monotonic()
    with serve(site) as base, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS, timeout=30_000)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: None if r.url.startswith((base, "data:", "blob:")) else foreign.append(r.url))
            page.on("console", lambda m: console.append(f"{page.url}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: console.append(f"{page.url}: {e}"))
            for path in _page_paths(pages):
                found = _check_page(page, base, path, site, pages, links)
                if found:
                    problems[path] = found
                if path in SCREENSHOTS:
                    page.locator("article img").first.scroll_into_view_if_needed(timeout=5_000)
                    page.screenshot(path=str(shots / (Path(path).stem + ".png")))
            hits = _search_finds(page, base, "V-trace")
        finally:
            browser.close()
        dead = _dead_links(links)
    pw_children = [p.pid for p in live_children() if p.pid not in before]
    browse_s = time.monotonic() - start

    print(
        f"\nsite: build {build_s:.1f} s, {len(_page_paths(pages))} pages and {len(links)} links checked "
        f"in {browse_s:.1f} s; screenshots: {', '.join(str(shots / (Path(p).stem + '.png')) for p in SCREENSHOTS)}"
    )
    assert not problems, "\n".join(f"{path}: {'; '.join(found)}" for path, found in problems.items())
    assert not console, "console errors:\n" + "\n".join(console[:20])
    assert not foreign, f"requests left the local server: {sorted(set(foreign))[:20]}"
    assert not dead, f"links that do not resolve: {dead[:20]}"
    assert hits > 0, "the search box found nothing for 'V-trace'"
    assert wait_gone(pw_children, within=10), f"browser processes left running: {pw_children}"
    for name in SCREENSHOTS:
        assert (shots / (Path(name).stem + ".png")).stat().st_size > 10_000, f"screenshot of {name} is (nearly) empty"
