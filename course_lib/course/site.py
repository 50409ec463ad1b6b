"""``course site``: the course as a static website, built offline from the repository alone.

Nothing on the site is written twice. At build time the pages are generated into a
source folder (``outputs/site_src/``) from what the repository already holds, then
MkDocs with the Material theme renders them into ``outputs/site/``, a folder of plain
files any static server can serve (or a browser can open directly):

- the home page: README's introduction and the course map (the figure and a table, both
  from the lesson catalog, :mod:`course_lib.course.catalog`);
- one page per available lesson: its committed, executed notebook with outputs and
  figures (:mod:`course_lib.course.site_markdown`), linked to its notebook and text source;
- one page per exercise notebook (the statements: stubs, hints, checks; no outputs) and
  README's "Exercises and grading" as the page on how grading works;
- a setup page from README's "Set up" and CONTRIBUTING.md's scales, tests and website sections,
  BENCHMARKS.md and the instructor's guide (INSTRUCTORS.md).

Offline by construction: math is typeset by MathJax 3 copied from the pinned
``django-static-mathjax`` package, search is Material's bundled lunr index, the theme's
web fonts are off, and no page names a CDN. A lesson notebook without outputs stops the
build with its name (:class:`SiteError`). :func:`serve` serves a built site on a local
port (``course site --serve``; the browser test uses it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from course_lib.course.catalog import LESSONS, Lesson, available_lessons
from course_lib.course.paths import output_dir, repo_root
from course_lib.course.site_markdown import notebook_markdown
from course_lib.runtime.processes import free_port

SITE_NAME = "Efficient RL Systems"
#: sections shown on the setup page, by file and heading; README's grading section is the grading page.
SETUP_SECTIONS = (
    ("README.md", "Set up"),
    ("CONTRIBUTING.md", "Scales"),
    ("CONTRIBUTING.md", "Tests"),
    ("CONTRIBUTING.md", "The website"),
)
GRADING_SECTION = "Exercises and grading"
# MathJax 3's browser build (es5/) from django-static-mathjax, less the bundles the site does not load
MATHJAX_SKIP = ("sre", "*-full*.js", "*svg*", "mml-*.js", "tex-mml-*.js", "node-main.js", "latest.js")
MATHJAX_CONFIG = """\
// MathJax 3 (bundled from django-static-mathjax): typeset what pymdownx.arithmatex marked\n// and headings with math in the table of contents.
window.MathJax = {
  tex: {
    inlineMath: [["\\\\(", "\\\\)"]],
    displayMath: [["\\\\[", "\\\\]"]],
    processEscapes: true,
    processEnvironments: true,
    formatError: function (jax, error) {
      console.error("MathJax could not parse: " + error.message);
      return jax.formatError(error);
    },
  },
  options: { ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex|md-nav__link", enableMenu: false },
  startup: {
    pageReady: function () {
      // the first typeset is over (the browser test waits for this mark)
      return MathJax.startup.defaultPageReady().then(function () {
        document.body.dataset.mathjax = "done";
      });
    },
  },
};
"""
SITE_CSS = """\
.nb-output { overflow-x: auto; margin: 0 0 1em; }
.md-typeset .nb-links { font-size: 0.75rem; }
.md-typeset img { max-width: 100%; height: auto; }
"""


class SiteError(RuntimeError):
    """The site cannot be built from this checkout (a notebook not executed, a README
    section missing); the message names what to fix."""


@dataclass
class SitePages:
    """What :func:`write_sources` generated: the nav and a few counts for the report."""

    nav: list[dict[str, Any]]
    lessons: list[Lesson]
    exercises: list[Lesson]
    widgets: dict[str, int] = field(default_factory=dict)


def default_site_dir() -> Path:
    """Where ``course site`` writes the built site (``outputs/site/``)."""
    return output_dir() / "site"


def page_title(lesson: Lesson) -> str:
    """A lesson's title in the navigation and the browser tab: ``03 · IMPALA: ...``."""
    return f"{lesson.number:02d} · {lesson.title}"


# --------------------------------------------------------------------------- checks


def is_executed(notebook: dict[str, Any]) -> bool:
    """True if the notebook has no code or at least one code cell that ran or has output."""
    code = [c for c in notebook.get("cells", []) if c.get("cell_type") == "code"]
    return not code or any(c.get("outputs") or c.get("execution_count") for c in code)


def check_executed(paths: list[Path]) -> None:
    """Stop the build if a notebook is missing or holds no outputs.

    Raises:
        SiteError: naming every such notebook and the command that executes it.
    """
    missing = [p for p in paths if not p.exists()]
    blank = [p for p in paths if p.exists() and not is_executed(json.loads(p.read_text(encoding="utf-8")))]
    problems = [f"{p} (missing)" for p in missing] + [f"{p} (not executed: no outputs)" for p in blank]
    if problems:
        raise SiteError(
            "the site shows each lesson's committed outputs, and these notebooks have none:\n  "
            + "\n  ".join(problems)
            + "\nexecute them with `.venv/bin/course build NN` (or `make build`), then build the site again."
        )


# --------------------------------------------------------------------------- README


def readme_sections(readme: str) -> dict[str, str]:
    """README's ``## `` sections by heading, and its introduction under ``""``."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in readme.splitlines():
        if line.startswith("## "):
            current = line[3:].strip()
            sections[current] = []
        elif not line.startswith("# "):
            sections[current].append(line)
    return {name: "\n".join(lines).strip() for name, lines in sections.items()}


def readme_section(sections: dict[str, str], heading: str, name: str = "README.md") -> str:
    """One section's body of README.md (or of the markdown file ``name``).

    Raises:
        SiteError: if the file has no such section (it was renamed: update the site's list).
    """
    if heading not in sections:
        raise SiteError(f"{name} has no section '## {heading}' (course_lib/course/site.py shows it on the site)")
    return sections[heading]


# --------------------------------------------------------------------------- pages


def _links_paragraph(pairs: list[tuple[str, str]], note: str) -> str:
    """The line under a page's title: links to its sources, then ``note``."""
    return " · ".join(f"[{label}]({href})" for label, href in pairs) + f"  \n{note}\n{{: .nb-links }}"


def _insert_after_title(markdown: str, title: str, line: str) -> str:
    """Put ``line`` under the page's first ``# `` heading (adding ``title`` if it has none)."""
    lines = markdown.split("\n")
    for i, text in enumerate(lines):
        if text.startswith("# "):
            return "\n".join(lines[: i + 1] + ["", line, ""] + lines[i + 1 :])
    return f"# {title}\n\n{line}\n\n{markdown}"


def _lesson_page(lesson: Lesson, root: Path, docs: Path, has_exercise: bool) -> tuple[str, int]:
    notebook = json.loads(lesson.notebook(root).read_text(encoding="utf-8"))
    body, widgets = notebook_markdown(notebook, docs / "lessons" / lesson.id, lesson.id)
    links = [
        ("notebook", f"../src/lessons/{lesson.id}.ipynb"),
        ("text source", f"../src/lessons/{lesson.id}.py"),
    ]
    if has_exercise:
        links.append(("exercises", f"../exercises/{lesson.id}.md"))
    header = _links_paragraph(links, "Run it yourself: `make lab` opens JupyterLab on the course.")
    return _insert_after_title(body, page_title(lesson), header), widgets


def _exercise_page(lesson: Lesson, root: Path, docs: Path) -> str:
    path = root / "exercises" / f"{lesson.id}.ipynb"
    body, _ = notebook_markdown(json.loads(path.read_text(encoding="utf-8")), docs, "", with_outputs=False)
    links = [
        ("exercise notebook", f"../src/exercises/{lesson.id}.ipynb"),
        ("its source", f"../src/exercises/src/{lesson.id}.py"),
        ("the lesson", f"../lessons/{lesson.id}.md"),
        ("how grading works", "index.md"),
    ]
    header = _links_paragraph(links, f"Grade your notebook: `.venv/bin/course grade exercises/{lesson.id}.ipynb`.")
    return _insert_after_title(body, f"Exercises {page_title(lesson)}", header)


def _lesson_table(lessons: tuple[Lesson, ...], root: Path, exercises: list[Lesson]) -> str:
    rows = ["| # | lesson | part | builds on | exercises |", "|---|---|---|---|---|"]
    for lesson in lessons:
        name = f"[{lesson.title}](lessons/{lesson.id}.md)" if lesson.available(root) else f"{lesson.title} (planned)"
        needs = ", ".join(f"{n:02d}" for n in lesson.requires) or "-"
        drill = f"[exercises](exercises/{lesson.id}.md)" if lesson in exercises else "-"
        rows.append(f"| {lesson.number:02d} | {name} | {lesson.part} | {needs} | {drill} |")
    return "\n".join(rows)


def _course_map_png(path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from course_lib.course.plots import course_map

    figure = Figure(figsize=(12, 4.8))
    FigureCanvasAgg(figure)
    course_map(figure.add_subplot())
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _home_page(readme: dict[str, str], root: Path, exercises: list[Lesson]) -> str:
    return "\n\n".join(
        [
            f"# {SITE_NAME}",
            readme[""],
            "## Course map",
            "![The lessons as boxes in columns of prerequisite depth, with arrows from each prerequisite]"
            "(assets/course_map.png)",
            _lesson_table(LESSONS, root, exercises),
            "## Where to go next",
            "- [Setup](setup.md): installing the course, the scales, the tests, this website.\n"
            "- [Exercises and grading](exercises/index.md): one notebook per lesson, graded by `course grade`.\n"
            "- [Benchmarks](benchmarks.md): what the systems measure on a laptop CPU and on a GPU.",
        ]
    )


def _copy_mathjax(target: Path) -> None:
    import mathjax  # django-static-mathjax: MathJax's own release files, no Django needed

    es5 = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    shutil.copytree(es5, target, ignore=shutil.ignore_patterns(*MATHJAX_SKIP))


def write_sources(docs: Path, root: Path | None = None) -> SitePages:
    """Generate every page, figure and asset of the site into ``docs`` (emptied first).

    Raises:
        SiteError: if a lesson notebook is missing or not executed, or README lacks a
            section the site shows.
    """
    root = root or repo_root()
    lessons = available_lessons(root)
    check_executed([lesson.notebook(root) for lesson in lessons])
    readme = readme_sections((root / "README.md").read_text(encoding="utf-8"))
    exercises = [lesson for lesson in lessons if (root / "exercises" / f"{lesson.id}.ipynb").exists()]

    if docs.exists():
        shutil.rmtree(docs)
    (docs / "lessons").mkdir(parents=True)
    (docs / "exercises").mkdir()
    pages = SitePages(nav=[], lessons=lessons, exercises=exercises)

    (docs / "index.md").write_text(_home_page(readme, root, exercises), encoding="utf-8")
    _course_map_png(docs / "assets" / "course_map.png")
    files = {"README.md": readme}
    files["CONTRIBUTING.md"] = readme_sections((root / "CONTRIBUTING.md").read_text(encoding="utf-8"))
    setup = "\n\n".join(
        f"## {heading}\n\n{readme_section(files[name], heading, name)}" for name, heading in SETUP_SECTIONS
    )
    (docs / "setup.md").write_text(f"# Setup\n\n{setup}\n", encoding="utf-8")
    grading = readme_section(readme, GRADING_SECTION)
    listing = "\n".join(f"- [{page_title(lesson)}]({lesson.id}.md)" for lesson in exercises)
    (docs / "exercises" / "index.md").write_text(
        f"# {GRADING_SECTION}\n\n{grading}\n\n## The exercise notebooks\n\n{listing}\n", encoding="utf-8"
    )
    shutil.copy2(root / "BENCHMARKS.md", docs / "benchmarks.md")
    shutil.copy2(root / "INSTRUCTORS.md", docs / "instructors.md")

    for lesson in lessons:
        text, pages.widgets[lesson.id] = _lesson_page(lesson, root, docs, lesson in exercises)
        (docs / "lessons" / f"{lesson.id}.md").write_text(text, encoding="utf-8")
        for suffix in (".ipynb", ".py"):
            _copy(root / "lessons" / f"{lesson.id}{suffix}", docs / "src" / "lessons")
    for lesson in exercises:
        (docs / "exercises" / f"{lesson.id}.md").write_text(_exercise_page(lesson, root, docs), encoding="utf-8")
        _copy(root / "exercises" / f"{lesson.id}.ipynb", docs / "src" / "exercises")
        _copy(lesson.exercise_source(root), docs / "src" / "exercises" / "src")

    _copy_mathjax(docs / "mathjax")
    (docs / "javascripts").mkdir()
    (docs / "javascripts" / "mathjax-config.js").write_text(MATHJAX_CONFIG, encoding="utf-8")
    (docs / "stylesheets").mkdir()
    (docs / "stylesheets" / "site.css").write_text(SITE_CSS, encoding="utf-8")

    pages.nav = [
        {"Home": "index.md"},
        {"Setup": "setup.md"},
        {"Lessons": [{page_title(lesson): f"lessons/{lesson.id}.md"} for lesson in lessons]},
        {
            "Exercises": [{"How grading works": "exercises/index.md"}]
            + [{page_title(lesson): f"exercises/{lesson.id}.md"} for lesson in exercises]
        },
        {"Benchmarks": "benchmarks.md"},
        {"Instructors": "instructors.md"},
    ]
    return pages


def _copy(source: Path, folder: Path) -> None:
    if source.exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, folder / source.name)


def mkdocs_config(docs: Path, site_dir: Path, nav: list[dict[str, Any]], repo_url: str | None = None) -> dict[str, Any]:
    """The MkDocs configuration: Material theme with no web fonts, offline search,
    arithmatex for MathJax, Pygments highlighting, previous/next links in lesson order."""
    config: dict[str, Any] = {
        "site_name": SITE_NAME,
        "site_description": "A Jupyter-first course on making RL training systems fast, cheap and predictable.",
        "docs_dir": str(docs),
        "site_dir": str(site_dir),
        "use_directory_urls": False,  # page.html links: any static server, and file:// (but search)
        "theme": {
            "name": "material",
            "font": False,  # no Google Fonts: the system's fonts
            "features": ["navigation.footer", "navigation.top", "search.highlight", "content.code.copy", "toc.follow"],
        },
        # not Material's "offline" plugin: it loads a shim for search over file:// from a CDN
        "plugins": ["search"],
        "markdown_extensions": [
            "admonition",
            "attr_list",
            "md_in_html",
            "tables",
            {"toc": {"permalink": True}},
            {"pymdownx.arithmatex": {"generic": True}},
            {"pymdownx.highlight": {"use_pygments": True}},
            "pymdownx.superfences",
        ],
        "extra_javascript": ["javascripts/mathjax-config.js", "mathjax/tex-chtml.js"],
        "extra_css": ["stylesheets/site.css"],
        "nav": nav,
    }
    if repo_url:
        config["repo_url"] = repo_url
    return config


def build_site(
    site_dir: Path | None = None,
    source_dir: Path | None = None,
    root: Path | None = None,
    repo_url: str | None = None,
) -> SitePages:
    """Generate the pages and build the site (MkDocs, strict: a broken link fails it).

    Args:
        site_dir: the built site (default ``outputs/site/``), replaced.
        source_dir: the generated pages and ``mkdocs.yml`` (default ``outputs/site_src/``).
        root: the course checkout (default: this one).
        repo_url: a repository link for the header (the Pages workflow passes the fork's).

    Raises:
        SiteError: as :func:`write_sources`, or if MkDocs reports a problem.
    """
    try:
        import yaml
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
        from mkdocs.exceptions import MkDocsException
    except ImportError as exc:
        raise SiteError(
            f"the website is built with MkDocs, which is in the course's `dev` extra ({exc}); "
            "install it with `make install-dev` (or `pip install -e '.[dev]'`)"
        ) from exc

    site_dir = (site_dir or default_site_dir()).resolve()
    source_dir = (source_dir or output_dir() / "site_src").resolve()
    pages = write_sources(source_dir / "docs", root)
    config_file = source_dir / "mkdocs.yml"
    config_file.write_text(
        yaml.safe_dump(mkdocs_config(source_dir / "docs", site_dir, pages.nav, repo_url), sort_keys=False),
        encoding="utf-8",
    )
    try:
        build(load_config(str(config_file), strict=True))
    except (MkDocsException, SystemExit) as e:
        raise SiteError(f"MkDocs could not build the site from {config_file}: {e}") from e
    return pages


# --------------------------------------------------------------------------- serving


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A browser that leaves a page mid-download resets its connection: not an error."""
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


@contextlib.contextmanager
def serve(site_dir: Path, port: int | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    """Serve ``site_dir`` over HTTP on ``host`` in a background thread; yields the base URL.

    The server is shut down and its socket closed on exit, also on error.
    """
    handler = functools.partial(_QuietHandler, directory=str(site_dir))
    server = _Server((host, port or free_port(host)), handler)
    thread = threading.Thread(target=server.serve_forever, name="course-site-server", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help="site folder (default: outputs/site)")
    parser.add_argument("--serve", action="store_true", help="then serve it on 127.0.0.1 until Ctrl-C")
    parser.add_argument("--port", type=int, default=None, help="port for --serve (default: a free one)")
    parser.add_argument("--repo-url", default=None, help="link to the repository in the site's header")


def run(args: argparse.Namespace) -> int:
    start = time.monotonic()
    try:
        pages = build_site(args.out, repo_url=args.repo_url)
    except SiteError as e:
        print(f"course site: {e}")
        return 1
    site_dir = (args.out or default_site_dir()).resolve()
    print(
        f"built {len(pages.lessons)} lessons and {len(pages.exercises)} exercise pages into {site_dir} "
        f"in {time.monotonic() - start:.1f} s; open {site_dir / 'index.html'} or serve the folder"
    )
    if args.serve:
        with serve(site_dir, args.port) as url:
            print(f"serving {url} (Ctrl-C stops it)")
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    return 0
