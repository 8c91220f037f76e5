"""The documentation site in a real browser: Debian's Chromium driven by Playwright.

Builds the site (or reuses ``_build/html`` when it is newer than every source), serves it on
127.0.0.1 and checks, in Chromium: every page loads without console errors or failed requests and
asks for nothing outside 127.0.0.1; the notebook pages show executed outputs and their plots; a
search for "xccl" finds the support matrix; every internal link resolves; what hosting needs
(canonical URL, sitemap, 404 page, edit links, copy buttons, notebook downloads) is there; on a
phone-sized screen, in light and dark mode, no page scrolls sideways and table text is readable;
at 1280 px and at 390 px nothing in the main column is wider than the column and no code block is
cut off. Static checks of the built pages: every ``--option`` of the sources reaches the HTML as
typed (no typographic dash), no ``<placeholder>`` in a command, the front page links every device
type's status page, the users' benchmark page is short, and the troubleshooting page names every
error class of the package. The users' pages (the users' guide, the device pages, the notebooks)
carry no pytest command, test file, commit hash or detail of the emulated device, and their bash
blocks parse with ``bash -n``; the landing page, the support grid, every device page and every
notebook page, laid out at 1400 px and 400 px (and screenshot into ``$ANYACCEL_SCREENSHOTS`` when set),
show no word broken inside itself, no table wider than its box without a scrollbar and no sideways
page scroll; migration diffs highlight the added lines.

The build reuses the notebooks that ``tests/test_lab.py`` executed just before (see
``docs/_ext/notebook_cache.py``): when their executed copies are fresh, the build must not
execute any notebook again.

Needs ``/usr/bin/chromium`` (``apt-get install -y --no-install-recommends chromium``); skipped with
that reason when it is absent. Playwright never downloads a browser here.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import notebook_cache  # noqa: E402

HTML = ROOT / "_build" / "html"
from _browser import CHROMIUM, launched_chromium  # noqa: E402
from device_passes import skip_repeat  # noqa: E402

BUILD_TIMEOUT_S = 540
SOURCES = ["conf.py", "docs", "notebooks", "src", "CHANGELOG.md", "benchmarks/results", "scripts/launch", "pyproject.toml"]
#: every notebook of notebooks/ (a new one is looked at without being listed here)
NOTEBOOK_PAGES = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
#: notebooks whose figures must be on the page (notebook 4's results are a table: no figure)
NOTEBOOKS_WITH_PLOTS = ["01_verify_environment", "02_single_card", "03_multi_card", "05_finetune_transformer",
                        "07_profiling"]
#: notebooks whose result is a report the page shows as text (the emulate tool's verdict), not a figure or a table
NOTEBOOK_RESULT_TEXT = {"06_any_accelerator": "problems: none"}
#: the downloaded notebook that runs with nbmake in a fresh directory (the shortest that installs what is
#: missing and writes the files it imports; tests/test_lab.py runs every notebook from a fresh directory)
NBMAKE_NOTEBOOK = "01_verify_environment"
NBMAKE_TIMEOUT_S = 600

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(BUILD_TIMEOUT_S + 120),  # the first test builds the site
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"no Chromium at {CHROMIUM}: apt-get install -y --no-install-recommends chromium"),
]


def _newest_source_mtime() -> float:
    newest = 0.0
    for name in SOURCES:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()
                                                and "runs" not in p.parts and "__pycache__" not in p.parts
                                                and ".ipynb_checkpoints" not in p.parts]
        newest = max([newest, *(p.stat().st_mtime for p in files)])
    return newest


def _build_site() -> None:
    """Build like ``make docs`` unless a complete build newer than every source exists."""
    stamp = HTML / ".buildinfo"
    if stamp.exists() and (HTML / "index.html").exists() and stamp.stat().st_mtime > _newest_source_mtime():
        return
    shutil.rmtree(HTML, ignore_errors=True)
    cached = [name for name in NOTEBOOK_PAGES if notebook_cache.fresh(ROOT / "notebooks" / f"{name}.ipynb")]
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-E", "-q", "-b", "html", ".", str(HTML)]
    proc = subprocess.Popen(cmd, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"the docs build did not finish in {BUILD_TIMEOUT_S}s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"docs build failed:\n{out[-6000:]}"
    # the notebooks the JupyterLab test just ran are not executed a second time
    for name in cached:
        assert f"notebooks/{name}: using the executed copy" in out, f"{name} was executed again:\n{out[-3000:]}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site():
    """The built site served on 127.0.0.1 at a free port; yields the base URL."""
    _build_site()
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    pytest.importorskip("playwright.sync_api")
    with launched_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def reader(browser):
    """One browser context for the page checks (:class:`PageVisit`): each opens its own page (tab) in it. The
    tabs share the HTTP cache, as a reader's do; no check stores anything (cookies, local storage) in it."""
    context = browser.new_context()
    try:
        yield context
    finally:
        context.close()


class PageVisit:
    """One page load, in a tab of its own, with everything the browser reported."""

    def __init__(self, reader, url: str) -> None:
        self.page = reader.new_page()
        self.page.set_default_timeout(30_000)
        self.errors: list[str] = []
        self.outside: list[str] = []
        self.failed: list[str] = []
        self.page.on("console", lambda msg: msg.type == "error" and self.errors.append(msg.text))
        self.page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        self.page.on("requestfailed", lambda req: self.failed.append(f"{req.url} ({req.failure})"))

        def route(r):
            host = urlparse(r.request.url).hostname
            if r.request.url.startswith(("data:", "blob:")) or host == "127.0.0.1":
                return r.continue_()
            self.outside.append(r.request.url)
            return r.abort()

        self.page.route("**/*", route)
        self.goto(url)

    def goto(self, url: str) -> None:
        """Load ``url`` in this visit's page, with empty lists of what the browser reported."""
        self.errors.clear()
        self.outside.clear()
        self.failed.clear()
        self.response = self.page.goto(url, wait_until="load")

    def close(self) -> None:
        self.page.close()


def _all_pages() -> list[str]:
    return sorted(str(p.relative_to(HTML)) for p in HTML.rglob("*.html")
                  if "_modules" not in p.parts and "_sources" not in p.parts)


def test_entry_point_redirects_to_start_page(site, reader):
    visit = PageVisit(reader, site)
    try:
        visit.page.wait_for_url("**/docs/index.html")
        assert "lightning-anyaccel" in visit.page.title()
        assert visit.page.locator("h1").first.inner_text().startswith("Lightning")
    finally:
        visit.close()


def test_every_page_loads_without_errors(site, browser):
    pages = _all_pages()
    assert len(pages) >= 12, pages
    problems = {}
    # one tab for all: each page loads in turn as a reader clicks through (its scripts run again, the theme's
    # files come from the cache after the first page asked for them); a context of its own, whose cache no
    # other test filled
    context = browser.new_context()
    visit = PageVisit(context, urljoin(site, pages[0]))
    try:
        for index, rel in enumerate(pages):
            if index:
                visit.goto(urljoin(site, rel))
            visit.page.wait_for_load_state("networkidle")
            status = visit.response.status if visit.response else None
            issues = [f"HTTP {status}"] if status != 200 else []
            issues += [f"console: {e}" for e in visit.errors]
            issues += [f"request outside 127.0.0.1: {u}" for u in visit.outside]
            issues += [f"failed request: {f}" for f in visit.failed if not any(u in f for u in visit.outside)]
            if issues:
                problems[rel] = issues
    finally:
        context.close()
    assert not problems, problems


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_notebook_pages_show_executed_outputs(site, reader, name):
    visit = PageVisit(reader, urljoin(site, f"notebooks/{name}.html"))
    try:
        page = visit.page
        code_cells = page.locator("div.nbinput").count()
        outputs = page.locator("div.nboutput").count()
        assert code_cells >= 5, f"{name}: {code_cells} code cells"
        assert outputs >= 3, f"{name}: only {outputs} outputs: the notebook was not executed"
        # execution counts are filled in only when the notebook ran
        prompts = page.locator("div.nbinput div.prompt").all_inner_texts()
        assert any("[1]" in p for p in prompts), prompts[:3]
        text = page.locator("article").inner_text()
        assert "Traceback" not in text, f"{name}: a cell output shows a traceback"
        if name in NOTEBOOKS_WITH_PLOTS:
            images = page.locator("div.nboutput img")
            assert images.count() >= 1, f"{name}: no plot"
            for i in range(images.count()):
                images.nth(i).scroll_into_view_if_needed()
                width = images.nth(i).evaluate("img => img.complete ? img.naturalWidth : 0")
                assert width > 100, f"{name}: plot {i} did not load"
        elif name in NOTEBOOK_RESULT_TEXT:
            assert NOTEBOOK_RESULT_TEXT[name] in text, f"{name}: no {NOTEBOOK_RESULT_TEXT[name]!r} in its outputs"
        else:
            assert page.locator("div.nboutput table").count() >= 1, f"{name}: no result table"
    finally:
        visit.close()


def test_search_for_xccl_finds_the_support_matrix(site, reader):
    visit = PageVisit(reader, urljoin(site, "search.html?q=xccl"))
    try:
        # Sphinx adds results one by one and writes the summary ("Search finished, found N pages")
        # when it is done: read the list only then.
        visit.page.locator("#search-results .search-summary").wait_for(timeout=30_000)
        visit.page.wait_for_function(
            "() => /found/i.test(document.querySelector('#search-results .search-summary').textContent)",
            timeout=30_000,
        )
        results = visit.page.locator("#search-results li a")
        hrefs = [results.nth(i).get_attribute("href") for i in range(results.count())]
        assert any("support_matrix" in (h or "") for h in hrefs), hrefs
        assert not visit.errors, visit.errors
    finally:
        visit.close()


def test_internal_links_resolve(site):
    """Every href/src on every page that points into the site names a file that exists (and its anchor)."""
    from html.parser import HTMLParser

    class Collector(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.links: list[str] = []
            self.ids: set[str] = set()

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            if "id" in attrs:
                self.ids.add(attrs["id"])
            for key in ("href", "src"):
                if attrs.get(key):
                    self.links.append(attrs[key])

    parsed = {}
    for rel in _all_pages():
        collector = Collector()
        collector.feed((HTML / rel).read_text(encoding="utf-8"))
        parsed[rel] = collector
    broken = []
    for rel, collector in parsed.items():
        base = urljoin("http://site/", rel)
        for link in collector.links:
            url, fragment = urldefrag(urljoin(base, link))
            target = urlparse(url)
            if target.scheme not in ("http", "https") or target.netloc != "site":
                continue  # external links and mailto: are not followed (no network in tests)
            path = target.path.lstrip("/") or "index.html"
            if path.endswith("/"):
                path += "index.html"
            if not (HTML / path).exists():
                broken.append(f"{rel}: {link}")
            elif fragment and path.endswith(".html") and path in parsed and fragment not in parsed[path].ids:
                broken.append(f"{rel}: {link} (no anchor #{fragment})")
    assert not broken, broken


def test_support_matrix_lists_every_device_of_the_table(site, reader):
    """The support grid comes first on its page: one row per device type, one short mark per feature, and the
    largest difference from one device (``E ≤4e-7``) from the records."""
    import re

    import device_pages
    import records_text

    from lightning_anyaccel.device.devices import DEVICE_TABLE

    pages = device_pages.load_pages(ROOT)
    validation = records_text.load_validation(ROOT).get("devices", {})
    visit = PageVisit(reader, urljoin(site, "docs/support_matrix.html"))
    try:
        assert visit.page.locator("article table").first.get_attribute("class").count("anyaccel-grid") == 1
        rows = visit.page.locator("table.anyaccel-grid tbody tr")
        assert rows.count() == len(DEVICE_TABLE)
        for i, spec in enumerate(DEVICE_TABLE.values()):
            cells = rows.nth(i).locator("td").all_inner_texts()
            assert cells[0] == f"{device_pages.family_name(spec.type, pages, spec.name)} {spec.type}", cells
            entry = validation.get(spec.type, {})
            expected = [device_pages.feature_mark(spec, entry, f) for f in device_pages.GRID_FEATURES]
            assert cells[1:] == [*expected, device_pages.parity_mark(spec, entry)], (spec.type, cells)
            assert all(len(cell) <= 6 for cell in cells[1:-1]), cells  # a mark, not a paragraph
            assert re.fullmatch(r"[HE] ≤[1-9]e-\d+|[–✗]", cells[-1]), cells
        table = visit.page.locator("table.anyaccel-support-matrix").inner_text()
        for spec in DEVICE_TABLE.values():
            if spec.backend:
                assert spec.backend in table
        # the evidence levels are explained above the grid and link the contributors' page
        assert visit.page.locator("article a[href^='evidence.html']").count() >= 1
    finally:
        visit.close()


# ---- hosting ---------------------------------------------------------------------------------


def test_hosting_essentials(site, reader):
    """Canonical URL, sitemap, 404 page, repository/edit links and copy buttons."""
    import tomllib

    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    sitemap = (HTML / "sitemap.xml").read_text()
    for page in ("docs/index.html", "docs/installation.html", "notebooks/02_single_card.html"):
        assert page in sitemap, f"{page} missing from sitemap.xml"
    assert (HTML / "404.html").exists()
    visit = PageVisit(reader, urljoin(site, "docs/installation.html"))
    try:
        page = visit.page
        canonical = page.locator("link[rel=canonical]").get_attribute("href")
        assert canonical and canonical.endswith("docs/installation.html"), canonical
        edit = page.locator(f"a[href^='{urls['Repository']}/edit/main/docs/installation.md']")
        assert edit.count() >= 1, "no 'edit this page' link to the repository"
        page.locator("button.copybtn").first.wait_for(state="attached", timeout=10_000)
    finally:
        visit.close()


@pytest.mark.parametrize("name", NOTEBOOK_PAGES)
def test_notebook_pages_link_the_notebook(site, reader, name):
    """A download of the executed notebook, and links to open it elsewhere, on every notebook page."""
    visit = PageVisit(reader, urljoin(site, f"notebooks/{name}.html"))
    try:
        links = visit.page.locator(".anyaccel-notebook-links a")
        hrefs = [links.nth(i).get_attribute("href") or "" for i in range(links.count())]
        downloads = [h for h in hrefs if h.endswith(f"{name}.ipynb") and not h.startswith("http")]
        assert downloads, hrefs
        downloaded = HTML / "notebooks" / downloads[0]
        assert downloaded.resolve().is_file(), downloads[0]
        assert '"outputs"' in downloaded.read_text() and '"image/png"' in downloaded.read_text() or \
            name not in NOTEBOOKS_WITH_PLOTS
        assert any("colab.research.google.com" in h for h in hrefs), hrefs
        assert any("/lab/tree/" in h for h in hrefs), hrefs
    finally:
        visit.close()


#: what sticks out of the main column (Furo's ``.content``) on the page now shown: every element
#: wider than the column (except inside a table's own scroll container that fits the column) and
#: every code block that hides part of a line behind a scroll bar (a notebook's text output, such as
#: Lightning's model summary, scrolls inside its output area instead)
COLUMN_JS = """() => {
    const column = document.querySelector('.content');
    if (!column) return ['no .content column'];
    const right = column.getBoundingClientRect().right;
    const problems = [];
    const say = (el, what) => problems.push(el.tagName.toLowerCase() + (el.className ? '.' + el.className : '')
        + ' ' + what + ': ' + (el.textContent || '').trim().replace(/\\s+/g, ' ').slice(0, 60));
    for (const el of column.querySelectorAll('*')) {
        const r = el.getBoundingClientRect();
        if (!r.width || r.right <= right + 1 || getComputedStyle(el).visibility === 'hidden') continue;
        if (!el.textContent.trim() && !el.children.length && el.tagName !== 'IMG') continue;  // wrapped spaces
        // a table may scroll inside its own container, and so may a notebook's text output
        const scroller = el.closest('.table-wrapper, div.nboutput div.output_area');
        if (scroller && scroller !== el && scroller.getBoundingClientRect().right <= right + 1) continue;
        say(el, Math.round(r.right - right) + 'px wider than the column');
    }
    for (const pre of column.querySelectorAll('pre')) {
        if (pre.closest('div.nboutput')) continue;  // output, not code: scrolls in its area (above)
        if (pre.scrollWidth > pre.clientWidth + 1) say(pre, 'cut off');
    }
    return problems.slice(0, 5);
}"""


def test_nothing_wider_than_the_column_at_1280px(site, browser):
    """On a laptop screen, every page's main column holds all of its content (code wraps, tables fit)."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = context.new_page()
        problems = {}
        for rel in _all_pages():
            if rel == "index.html":
                continue  # the entry point only redirects
            page.goto(urljoin(site, rel), wait_until="load")
            found = page.evaluate(COLUMN_JS)
            if found:
                problems[rel] = found
        assert not problems, f"1280px wide: {problems}"
    finally:
        context.close()


# ---- small screens and dark mode --------------------------------------------------------------

#: contrast ratio of a table cell's text against its background (WCAG AA for normal text)
CONTRAST_JS = """() => {
    const rgb = s => (s.match(/[\\d.]+/g) || []).map(Number);
    const lum = ([r, g, b]) => {
        const c = [r, g, b].map(v => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    };
    const background = el => {
        for (; el; el = el.parentElement) {
            const c = rgb(getComputedStyle(el).backgroundColor);
            if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) return c;
        }
        return [255, 255, 255];
    };
    const worst = [];
    for (const cell of document.querySelectorAll('article table td, article table th')) {
        if (!cell.textContent.trim()) continue;
        const [a, b] = [lum(rgb(getComputedStyle(cell).color)), lum(background(cell))];
        const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
        if (ratio < 4.5) worst.push(cell.textContent.trim().slice(0, 40) + ' (' + ratio.toFixed(2) + ')');
    }
    return worst.slice(0, 5);
}"""

OVERFLOW_JS = """() => {
    const width = document.documentElement.clientWidth;
    const page = document.documentElement.scrollWidth - width;
    // a table may be wider than the screen only inside a container that scrolls by itself
    const tables = [...document.querySelectorAll('article table')].filter(t => {
        if (t.getBoundingClientRect().right <= width + 1) return false;
        for (let el = t.parentElement; el; el = el.parentElement) {
            const o = getComputedStyle(el).overflowX;
            if ((o === 'auto' || o === 'scroll') && el.clientWidth <= width) return false;
        }
        return true;
    });
    return {page, tables: tables.length};
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_phone_screen_no_sideways_scrolling_and_readable_tables(site, browser, scheme):
    """390 px (a current phone): no sideways scrolling, nothing wider than the column, readable tables."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2,
                                  is_mobile=True, has_touch=True, color_scheme=scheme)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        problems = {}
        for rel in _all_pages():
            if rel == "index.html":
                continue  # the entry point only redirects (test_entry_point_redirects_to_start_page)
            page.goto(urljoin(site, rel), wait_until="load")
            overflow = page.evaluate(OVERFLOW_JS)
            unreadable = page.evaluate(CONTRAST_JS)
            issues = [] if scheme == "dark" else page.evaluate(COLUMN_JS)  # the layout is the same in both
            if overflow["page"] > 1:
                issues.append(f"page scrolls sideways by {overflow['page']}px")
            if overflow["tables"]:
                issues.append(f"{overflow['tables']} table(s) wider than the screen without a scroll container")
            if unreadable:
                issues.append(f"table text with contrast < 4.5: {unreadable}")
            if issues:
                problems[rel] = issues
        assert not problems, f"{scheme} mode, 390px wide: {problems}"
    finally:
        context.close()


# ---- copy exactly, install from the page, the front door, short user pages -------------------


@functools.cache
def _page_texts() -> dict[str, str]:
    """The text of every page of the site (tags removed, entities decoded), by path."""
    import html
    import re

    return {rel: html.unescape(re.sub(r"<[^>]+>", "", (HTML / rel).read_text(encoding="utf-8")))
            for rel in _all_pages()}


def _code_blocks(rel: str) -> list[tuple[str, str]]:
    """(language, text) of every highlighted code block of a page."""
    import html
    import re

    source = (HTML / rel).read_text(encoding="utf-8")
    return [(lang, html.unescape(re.sub(r"<[^>]+>", "", code))) for lang, code in re.findall(
        r'<div class="highlight-([\w-]+)[^"]*"><div class="highlight"><pre>(.*?)</pre>', source, re.S)]


def test_double_hyphens_reach_the_page_as_typed(site):
    """Every ``--option`` written in the sources is on the built pages as ``--option``, and no dash
    that typography made out of ``--`` is (pip: "Invalid requirement: '–index-url'")."""
    import re

    from lightning_anyaccel.device.devices import DEVICE_TABLE

    sources = [p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md")]
    sources += [spec.install for spec in DEVICE_TABLE.values()]
    options = {m for text in sources for m in re.findall(r"(?<![\w-])--[a-z][\w-]+", text)}
    assert "--index-url" in options and "--device" in options, sorted(options)[:20]
    site_text = "\n".join(_page_texts().values())
    missing = sorted(option for option in options if option not in site_text)
    assert not missing, f"options typed in the sources but not on the pages: {missing}"
    written = {m for text in sources for m in re.findall(r"[–—][a-z][\w-]+", text)}
    dashes = sorted({m for m in re.findall(r"[–—][a-z][\w-]+", site_text)} - written)
    assert not dashes, f"dashes before an option name that the sources do not have: {dashes}"


def test_install_commands_have_no_placeholders(site):
    """No ``<...>`` in a command and no ``<words with spaces>`` anywhere; the repository URL is the one
    of ``pyproject.toml`` and every page that tells how to install shows it in a command."""
    import re

    import tomllib

    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"].rstrip("/")
    problems = []
    for rel, text in _page_texts().items():
        problems += [f"{rel}: unfilled {m}" for m in re.findall(r"\{\{\s*\w+\s*\}\}", text)]
        problems += [f"{rel}: {m}" for m in re.findall(r"<[A-Za-z][\w.-]*(?: [\w.-]+)+>", text)
                     if not m.startswith(("<built-in", "<method", "<function"))]  # profiler names, reprs
        for lang, code in _code_blocks(rel):
            if lang in ("bash", "console", "shell", "sh", "default", "text"):
                problems += [f"{rel} ({lang} block): {m}" for m in re.findall(r"<[^<>\n]{1,40}>", code)
                             if m != "<module>"]  # a frame's name in a printed report, not a placeholder
    assert not problems, problems
    for rel in ("docs/installation.html", "docs/index.html", "docs/devices/xpu.html"):
        commands = "\n".join(code for lang, code in _code_blocks(rel) if lang == "bash")
        assert f'pip install "git+{repository}.git"' in commands, f"{rel}: {commands}"
    clone = "\n".join(code for _, code in _code_blocks("docs/installation.html"))
    assert f"git clone {repository}.git\ncd {repository.rsplit('/', 1)[1]}\npip install ." in clone, clone


def test_front_page_links_every_device_status_page(site, reader):
    """One badge per device type on the front page, naming what ran (the device and the processes of a
    hardware record; AMD only where a ROCm record exists); each opens that device's page, which answers
    its users first: what to install, the lines to change, the check, what differs from the vendor's
    plugin, the launch recipe and how far each feature was proven."""
    import device_pages
    import records_text

    from lightning_anyaccel.device.devices import DEVICE_TABLE

    data = records_text.load_validation(ROOT)
    validation = data.get("devices", {})
    facts = device_pages.load_pages(ROOT)
    rocm = any("AMD" in str(r.get("device_name", "")) or r.get("rocm") for r in data["records"].values())
    visit = PageVisit(reader, urljoin(site, "docs/index.html"))
    try:
        cards = visit.page.locator("ul.anyaccel-device-status a.anyaccel-device")
        found = {}
        for i in range(cards.count()):
            href = cards.nth(i).get_attribute("href") or ""
            found[href.rsplit("/", 1)[-1].removesuffix(".html")] = (href, cards.nth(i).inner_text())
        assert set(found) == set(DEVICE_TABLE), (sorted(found), sorted(DEVICE_TABLE))
        for device_type, (href, card) in found.items():
            entry = validation.get(device_type, {})
            badge = device_pages.badge_text(entry)
            assert badge in card, (device_type, card)
            record = entry.get(entry.get("status", ""))
            if entry.get("status") == "hardware":
                assert record["device_name"] in badge and "process" in badge, badge
            assert ("AMD" in card) <= rocm, f"{device_type}: AMD named without a ROCm record: {card}"
            visit.page.goto(urljoin(urljoin(site, "docs/index.html"), href), wait_until="load")
            text = visit.page.locator("article").inner_text()
            parts = ["What you need", "Vendor stack:", "Too old:", "Run here:", "Install guide:", "The lines to change", "The check",
                     f"lightning_anyaccel.verify --device {device_type}", "What the package does for you",
                     "How far each feature was proven", badge]
            if "compare" in facts.get(device_type, {}):
                parts.append("Compared with")
            for part in parts:
                assert part in text, f"{device_type} page: no {part!r}"
            order = [text.index(p) for p in ("What you need", "The lines to change", "The check")]
            assert order == sorted(order), f"{device_type} page: not in the order a user needs them"
            assert "Known limitations here" not in text  # what the package fixes is not a limitation
    finally:
        visit.close()


# ---- users' pages say what the user gets; contributors' pages how we know ----------------------


def _users_pages() -> list[str]:
    """The built pages of the users' guide (docs/index.md's first toctree, the generated device pages and
    the notebooks). The changelog, a record of how the project changed and was tested, is in the contributors'
    guide: listed here, it would be checked as a users' page."""
    import re

    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    block = re.search(r"```\{toctree\}\n(?:\:[^\n]*\n)*?:caption: Users' guide\n(.*?)```", index, re.S)
    assert block, "no users' guide toctree in docs/index.md"
    names = [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith(":")]
    pages = []
    for name in names:
        pattern = name.lstrip("/") if name.startswith("/") else f"docs/{name}"
        pages += sorted(str(p.relative_to(HTML)) for p in HTML.glob(pattern + ".html"))
    pages += sorted(str(p.relative_to(HTML)) for p in (HTML / "docs" / "devices").glob("*.html"))
    assert "docs/devices/hpu.html" in pages and "docs/installation.html" in pages, pages
    return pages


#: what a users' page must not carry: how we know belongs on the contributors' pages
TEST_TALK = {
    "a pytest command or selection": r"\bpytest\b|\s-k\s+[\"']",
    "a test file": r"\btests/[\w/.-]+",
    "a commit hash": r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{10,40}\b",
    "a detail of the emulated device": r"\bemulator\b|\bemuccl\b|torch's backend map",
}


#: users' pages whose subject is the emulated device as the user's own tool (its command, its pytest plugin)
EMULATOR_TOOL_PAGES = {"docs/emulate.html", "notebooks/06_any_accelerator.html", "notebooks/07_profiling.html"}
EMULATOR_TOOL_WORDS = {"a pytest command or selection", "a detail of the emulated device"}


def test_users_pages_carry_no_test_talk(site):
    import re

    problems = []
    texts = _page_texts()
    for rel in _users_pages():
        for what, pattern in TEST_TALK.items():
            if rel in EMULATOR_TOOL_PAGES and what in EMULATOR_TOOL_WORDS:
                continue
            problems += [f"{rel}: {what}: {m.group(0)!r}" for m in re.finditer(pattern, texts[rel])]
    assert not problems, "\n".join(problems[:30])
    # the check can fail: the contributors' evidence page has every one of them
    evidence = texts["docs/evidence.html"]
    assert all(re.search(pattern, evidence) for what, pattern in TEST_TALK.items() if what != "a pytest command or selection")


def test_shell_blocks_on_users_pages_run_as_written(site):
    """Every bash block of a users' page parses with ``bash -n`` as copied (a block with placeholders is a
    ``text`` block, never a bash one)."""
    problems = []
    for rel in _users_pages():
        for lang, code in _code_blocks(rel):
            if lang not in ("bash", "shell", "sh", "console"):
                continue
            proc = subprocess.run(["bash", "-n"], input=code, text=True, capture_output=True, timeout=30)
            if proc.returncode:
                problems.append(f"{rel}: {proc.stderr.strip()}\n{code}")
    assert not problems, "\n\n".join(problems)
    # the check can fail: what the npu page's install block once was
    assert subprocess.run(["bash", "-n"], input="pip install torch_npu matching your torch version (Ascend CANN required)\n",
                          text=True, capture_output=True, timeout=30).returncode != 0


# ---- looked at in a real browser: 1400 px and 400 px --------------------------------------------

#: words broken inside themselves (a run of letters laid out on two lines), tables wider than their
#: box without a scroll container, empty inline code boxes, and sideways scrolling of the page
LAYOUT_JS = r"""() => {
    const problems = [];
    const width = document.documentElement.clientWidth;
    if (document.documentElement.scrollWidth > width + 1)
        problems.push('page scrolls sideways by ' + (document.documentElement.scrollWidth - width) + 'px');
    const article = document.querySelector('article') || document.body;
    for (const table of article.querySelectorAll('table')) {
        let box = table.parentElement, scrolls = false;
        for (let el = box; el && el !== article.parentElement; el = el.parentElement) {
            const o = getComputedStyle(el).overflowX;
            if ((o === 'auto' || o === 'scroll') && el.getBoundingClientRect().width <= width + 1) { scrolls = true; break; }
        }
        if (table.getBoundingClientRect().width > box.getBoundingClientRect().width + 1 && !scrolls)
            problems.push('table wider than its box without a scrollbar: ' + table.textContent.trim().slice(0, 40));
    }
    // an inline code box without text (what is left of one when a script moves its text elsewhere)
    for (const code of article.querySelectorAll('code'))
        if (!code.closest('pre') && code.textContent === '' && !code.querySelector('img, svg'))
            { problems.push('empty code box before: ' + (code.nextSibling ? code.nextSibling.textContent.slice(0, 30) : '')); break; }
    // inline code in running text and API signatures may break between characters (an identifier is not a
    // word); code blocks wrap
    const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT, {acceptNode: n =>
        n.parentElement.closest('pre, script, style, .MathJax, svg, .nboutput, dt.sig') ||
        (n.parentElement.closest('code') && !n.parentElement.closest('table'))
            ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT});
    const range = document.createRange();
    // the lines a range is laid out on: its boxes (text, and the code elements it crosses, whose padding makes
    // their tops differ from the text's) grouped by vertical overlap
    const lines = () => {
        const boxes = [...range.getClientRects()].filter(r => r.width > 0).sort((a, b) => a.top - b.top);
        let count = 0, bottom = -Infinity;
        for (const r of boxes) {
            if (r.top >= bottom - 2) { count++; bottom = r.bottom; } else bottom = Math.max(bottom, r.bottom);
        }
        return count;
    };
    for (let node = walker.nextNode(); node && problems.length < 8; node = walker.nextNode()) {
        for (const m of node.textContent.matchAll(/[\p{L}\p{N}]{2,}/gu)) {
            range.setStart(node, m.index);
            range.setEnd(node, m.index + m[0].length);
            if (lines() > 1) { problems.push('word broken mid-word: ' + m[0]); break; }
        }
    }
    // in tables, titles and code blocks a whole token ("GPT-2", "2026-11-28", "--index-url", up to TOKEN
    // characters: a longer one may have to wrap) stays on one line, read across the elements of its cell,
    // title or code block
    const TOKEN = 30, blocks = new Map();
    for (const zone of article.querySelectorAll('table, h1, h2, h3, h4, pre')) {
        const texts = document.createTreeWalker(zone, NodeFilter.SHOW_TEXT);
        for (let node = texts.nextNode(); node; node = texts.nextNode()) {
            if (node.parentElement.closest('.headerlink, script, style')) continue;
            const block = node.parentElement.closest('td, th, p, li, dt, dd, h1, h2, h3, h4, pre, div');
            if (!blocks.has(block)) blocks.set(block, new Set());
            blocks.get(block).add(node);
        }
    }
    for (const nodes of blocks.values()) {
        const list = [...nodes], starts = [];
        let text = '';
        for (const node of list) { starts.push(text.length); text += node.textContent; }
        const at = i => { let k = starts.length - 1; while (starts[k] > i) k--; return [list[k], i - starts[k]]; };
        for (const m of text.matchAll(/\S{2,}/gu)) {
            if (m[0].length > TOKEN || problems.length >= 12) continue;
            range.setStart(...at(m.index));
            range.setEnd(...at(m.index + m[0].length - 1));
            range.setEnd(range.endContainer, range.endOffset + 1);
            if (lines() > 1) problems.push('token broken inside: ' + m[0]);
        }
    }
    return problems;
}"""


def _looked_at_pages() -> list[str]:
    pages = ["docs/index.html", "docs/support_matrix.html", "docs/installation.html"]
    # the pages users read when a run fails or a vendor validates, and the API reference
    pages += [f"docs/{name}.html" for name in ("troubleshooting", "faults", "validate_hardware", "scale_out", "api")]
    pages += sorted(str(p.relative_to(HTML)) for p in (HTML / "docs" / "devices").glob("*.html"))
    pages += sorted(str(p.relative_to(HTML)) for p in (HTML / "notebooks").glob("*.html"))
    return pages


@pytest.mark.parametrize("width", [1400, 400])
def test_layout_in_chromium_at_desktop_and_phone_width(site, browser, width):
    """The landing page, the support grid, the installation, troubleshooting, faults, validation, scale-out and
    API pages, every device page and every notebook page, screenshot at the width: no word broken inside
    itself, no token of a table, title or code block broken inside itself, no table wider than its box without
    a scrollbar, no sideways scrolling; the support grid in the first screen, and at 1400 px every column of
    it in view. The screenshots, for a person to look at, go to ``$ANYACCEL_SCREENSHOTS``; without it none is
    taken (the checks read the page itself, every image loaded: the site has no lazy images)."""
    shots = Path(os.environ["ANYACCEL_SCREENSHOTS"]) if os.environ.get("ANYACCEL_SCREENSHOTS") else None
    if shots:
        shots.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": width, "height": 900})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        problems = {}
        pages = _looked_at_pages()
        assert len([p for p in pages if p.startswith("notebooks/")]) >= len(NOTEBOOK_PAGES), pages
        for rel in pages:
            page.goto(urljoin(site, rel), wait_until="load")
            if shots:
                page.screenshot(path=str(shots / f"{rel.replace('/', '_').removesuffix('.html')}_{width}.png"),
                                full_page=True)
            found = page.evaluate(LAYOUT_JS)
            if found:
                problems[rel] = found
        assert not problems, f"{width}px wide: {problems}"
        # the support grid: in the first screen at 400 px, every column in view at 1400 px
        page.goto(urljoin(site, "docs/support_matrix.html"), wait_until="load")
        grid = page.evaluate("""() => { const t = document.querySelector('table.anyaccel-grid');
            const r = t.getBoundingClientRect(), box = t.parentElement.getBoundingClientRect();
            return {top: r.top, width: r.width, box: box.width, screen: innerHeight}; }""")
        assert grid["top"] < grid["screen"] - 200, f"{width}px: the grid starts at {grid['top']:.0f}px of {grid['screen']}"
        if width >= 1400:
            assert grid["width"] <= grid["box"] + 1, f"{width}px: the grid ({grid['width']:.0f}px) is cut at {grid['box']:.0f}px"
        # the check can fail: a table cell that breaks words, squeezed into a narrow box
        page.goto(urljoin(site, "docs/support_matrix.html"), wait_until="load")
        page.evaluate("""() => { const t = document.querySelector('table.anyaccel-grid');
            t.parentElement.style.overflowX = 'visible'; t.style.width = '60px';
            for (const c of t.querySelectorAll('td, th')) { c.style.overflowWrap = 'anywhere'; c.style.whiteSpace = 'normal'; } }""")
        assert any("mid-word" in p for p in page.evaluate(LAYOUT_JS))
        # and a token of a table that may break after its hyphen, in a cell squeezed narrower than it
        page.goto(urljoin(site, "docs/support_matrix.html"), wait_until="load")
        page.evaluate("""() => { const cell = document.querySelector('table.anyaccel-grid td');
            cell.parentElement.closest('table').parentElement.style.overflowX = 'visible';
            cell.textContent = 'GPT-2 2026-11-28'; cell.style.width = '1px'; cell.style.minWidth = '0';
            cell.style.whiteSpace = 'normal'; }""")
        assert any("token broken inside" in p for p in page.evaluate(LAYOUT_JS)), page.evaluate(LAYOUT_JS)
    finally:
        context.close()


def test_migration_diffs_highlight_the_added_lines(site, reader):
    """In a diff the added lines are the change: they get a background, the removed ones do not."""
    visit = PageVisit(reader, urljoin(site, "docs/migration.html"))
    try:
        backgrounds = visit.page.evaluate("""() => ['gi', 'gd'].map(c => {
            const el = document.querySelector('.highlight-diff .' + c);
            return el ? getComputedStyle(el).backgroundColor : null; })""")
        added, removed = backgrounds
        assert added and added not in ("rgba(0, 0, 0, 0)", "transparent"), backgrounds
        assert removed in ("rgba(0, 0, 0, 0)", "transparent"), backgrounds
    finally:
        visit.close()


def test_users_benchmark_page_is_short_with_one_chart(site, reader):
    visit = PageVisit(reader, urljoin(site, "docs/performance.html"))
    try:
        article = visit.page.locator("article")
        words = len(article.inner_text().split())
        assert words < 600, f"{words} words"
        images = article.locator("img")
        assert images.count() == 1
        images.first.scroll_into_view_if_needed()
        assert images.first.evaluate("img => img.complete ? img.naturalWidth : 0") > 100
        hrefs = [a.get_attribute("href") or "" for a in article.locator("a").all()]
        assert any(h.startswith("benchmarks.html") for h in hrefs), hrefs  # the details, one click away
        from lightning_anyaccel.device.devices import DEVICE_TABLE

        results = [p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json") if p.stem in DEVICE_TABLE]
        sentences = article.locator("li").all_inner_texts()
        for device_type in results:
            assert any(s.startswith(f"{device_type} (") for s in sentences), (device_type, sentences)
    finally:
        visit.close()


def test_troubleshooting_names_every_error_of_the_package(site):
    """Every exception class the package raises for bad input is an entry of the troubleshooting page."""
    import inspect

    import lightning_anyaccel
    from lightning_anyaccel import accelerator
    from lightning_anyaccel.checkpoints import checkpoint
    from lightning_anyaccel.cluster import launch_layout
    from lightning_anyaccel.device import distributed, precision, runtime
    from lightning_anyaccel.strategies import errors
    from lightning_anyaccel.wiring import policy

    classes = {name for module in (lightning_anyaccel, accelerator, checkpoint, distributed, launch_layout, policy,
                                   precision, runtime, errors)
               for name, value in vars(module).items()
               if inspect.isclass(value) and issubclass(value, Exception)
               and value.__module__.startswith("lightning_anyaccel")}
    assert len(classes) >= 10, classes
    text = _page_texts()["docs/troubleshooting.html"]
    missing = sorted(name for name in classes if name not in text)
    assert not missing, f"not on the troubleshooting page: {missing}"
    # the anchors the errors' messages link to (lightning_anyaccel.troubleshooting)
    from lightning_anyaccel.troubleshooting import LinkedError

    html = (HTML / "docs" / "troubleshooting.html").read_text(encoding="utf-8")
    anchors = [cls.__name__.lower() for cls in LinkedError.__subclasses__()]
    assert not [a for a in anchors if f'id="{a}"' not in html], anchors



def test_the_installation_page_names_no_amd_gpu_without_a_rocm_record(site):
    """The installation page as built (its generated table included) names no AMD GPU or ROCm while no record ran
    on one (tests/test_landing_facts.py checks the sources of the README, the landing pages and the notebooks)."""
    from test_landing_facts import _records, amd_claims

    assert not amd_claims(_page_texts()["docs/installation.html"], _records())


#: Lightning's own queries that a user calls on the package's classes (``AnyMPIEnvironment.detect()``,
#: ``AnyAccelerator.auto_device_count()``): the only overrides of Lightning's names the API page may document
USER_QUERIES = {"detect", "is_available", "auto_device_count", "get_device_stats"}


def api_entries(html: str) -> list[tuple[str, str, str]]:
    """(kind, class, member) of every entry of an autodoc page: ``("method", "lightning_anyaccel.AnyAccelerator",
    "setup")``; a class's or function's own entry has member ``""``."""
    import re

    entries, stack = [], []  # stack: per open <dl>, the class it documents (None for any other)
    for tag in re.finditer(r'<dl class="py (\w+)">\s*<dt class="sig sig-object py"[^>]*>(.*?)</dt>|<dl[^>]*>|</dl>',
                           html, re.S):
        if tag.group(0) == "</dl>":
            if stack:
                stack.pop()
            continue
        if tag.group(1) is None:  # a field list, a definition list
            stack.append(None)
            continue
        kind, signature = tag.group(1), tag.group(2)
        prename = "".join(re.findall(r'sig-prename descclassname"><span class="pre">([^<]*)<', signature))
        name = "".join(re.findall(r'sig-name descname"><span class="pre">([^<]*)<', signature))
        owner = next((c for c in reversed(stack) if c), None)
        if owner and kind in ("method", "attribute", "property"):
            entries.append((kind, owner, name))
        else:
            entries.append((kind, prename + name, ""))
        stack.append(prename + name if kind in ("class", "exception") else None)
    return entries


def lightning_overrides(entries: list[tuple[str, str, str]]) -> list[str]:
    """The documented members that override a name of a base class from outside the package (a Lightning
    hook such as ``setup`` or ``set_world_size``: Lightning calls it, the user does not), but the user's queries."""
    import importlib

    found = []
    for _, owner, member in entries:
        if not member or member in USER_QUERIES:
            continue
        module, _, cls_name = owner.rpartition(".")
        cls = getattr(importlib.import_module(module), cls_name)
        if any(member in vars(base) for base in cls.__mro__[1:]
               if base is not object and not base.__module__.startswith("lightning_anyaccel")):
            found.append(f"{owner}.{member}")
    return found


def test_the_api_page_documents_what_a_user_calls(site):
    """docs/api.md lists what a user imports and calls: no Lightning hook the classes override, no command's
    ``main``, no internal base class (``Bases: AnyAcceleratorMixin``) and no private module in its prose."""
    import re

    html = (HTML / "docs" / "api.html").read_text(encoding="utf-8")
    entries = api_entries(html)
    assert len(entries) >= 40 and ("class", "lightning_anyaccel.AnyDDPStrategy", "") in entries, entries[:10]
    assert not lightning_overrides(entries), f"Lightning hooks on the API page: {lightning_overrides(entries)}"
    assert not [e for e in entries if e[2] == "main" or e[1].endswith(".main")], "a command's main() is not an API"
    bases = [re.sub(r"<[^>]+>", "", b) for b in re.findall(r"Bases: (.*?)</p>", html, re.S)]
    assert bases and not [b for b in bases if "Mixin" in b or re.search(r"(^|, )_", b)], bases
    text = _page_texts()["docs/api.html"]
    assert not re.findall(r"lightning_anyaccel\._\w+", text), re.findall(r"lightning_anyaccel\._[\w.()]+", text)
    # the check can fail: the AnyAccelerator class of the package overrides Lightning's setup and teardown
    made_up = [("class", "lightning_anyaccel.AnyAccelerator", ""), ("method", "lightning_anyaccel.AnyAccelerator", "setup")]
    assert lightning_overrides(made_up) == ["lightning_anyaccel.AnyAccelerator.setup"]


def _download(site: str, reader, name: str) -> tuple[bytes, str]:
    """Notebook ``name`` as its page's download link gives it, and the page's Colab link."""
    import urllib.request

    visit = PageVisit(reader, urljoin(site, f"notebooks/{name}.html"))
    try:
        href = visit.page.locator(".anyaccel-notebook-links a[download]").first.get_attribute("href")
        colab = visit.page.locator(".anyaccel-notebook-links a[href*='colab.research.google.com']")
        colab_href = colab.first.get_attribute("href") or ""
    finally:
        visit.close()
    with urllib.request.urlopen(urljoin(site, f"notebooks/{href}"), timeout=30) as response:
        return response.read(), colab_href


def test_downloaded_notebooks_are_the_repositorys(site, reader):
    """Every notebook as its page offers it (the download link) is the repository's notebook: the same code
    cells and kernel, so what ran in JupyterLab from an empty directory (tests/test_lab.py, every notebook) is
    what a user downloads; and the Colab link opens that notebook of the repository."""
    import json

    for name in NOTEBOOK_PAGES:
        downloaded, colab_href = _download(site, reader, name)
        source = json.loads((ROOT / "notebooks" / f"{name}.ipynb").read_text())
        notebook = json.loads(downloaded)
        cells = [c["source"] if isinstance(c["source"], str) else "".join(c["source"])
                 for c in notebook["cells"] if c["cell_type"] == "code"]
        assert cells == ["".join(c["source"]) for c in source["cells"] if c["cell_type"] == "code"], name
        assert notebook["metadata"].get("kernelspec") == source["metadata"].get("kernelspec"), name
        assert colab_href.endswith(f"/blob/main/notebooks/{name}.ipynb"), colab_href


@pytest.mark.timeout(NBMAKE_TIMEOUT_S + 120)
def test_a_downloaded_notebook_runs_in_a_fresh_directory(site, reader, tmp_path):
    """The first notebook, downloaded from its page into an empty directory outside the repository, runs
    there with ``pytest --nbmake`` as a user tests it: it installs what is missing and writes what it imports.
    A repeat: the download is the repository's notebook (test_downloaded_notebooks_are_the_repositorys),
    which tests/test_lab.py runs from an empty directory, and nbmake runs a repository notebook from an empty
    folder in tests/test_notebook_on_device.py; ``ANYACCEL_RUN_REPEATS=1`` runs it."""
    import signal

    skip_repeat("tests/test_lab.py's run of the same cells and tests/test_notebook_on_device.py's nbmake run")
    fresh = tmp_path / "downloads"
    fresh.mkdir()
    (fresh / f"{NBMAKE_NOTEBOOK}.ipynb").write_bytes(_download(site, reader, NBMAKE_NOTEBOOK)[0])
    (fresh / "pytest.ini").write_text("[pytest]\n")  # not the repository's configuration
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--nbmake",
           "-c", str(fresh / "pytest.ini"), f"{NBMAKE_NOTEBOOK}.ipynb"]
    proc = subprocess.Popen(cmd, cwd=fresh, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=NBMAKE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the downloaded notebook did not finish in {NBMAKE_TIMEOUT_S}s:\n{out[-4000:]}")
    assert proc.returncode == 0, out[-6000:]
    assert "1 passed" in out, out[-2000:]


def test_notebook_pages_show_no_warning_box(site):
    """A cell's stderr is a red box on its page (nbsphinx's ``stderr`` class): no notebook page shows one.
    A warning a user can act on is explained in the text instead (docs/contributing.md)."""
    import re

    pages = sorted((HTML / "notebooks").glob("*.html"))
    assert len(pages) >= 5, pages
    boxes = {page.name: len(re.findall(r'class="[^"]*\bstderr\b', page.read_text(encoding="utf-8")))
             for page in pages}
    assert not {name: count for name, count in boxes.items() if count}, boxes
