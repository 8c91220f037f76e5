"""The notebooks in JupyterLab, in a real browser, the way ``make lab`` serves them.

Starts JupyterLab like ``make lab`` (default kernel ``lightning-anyaccel``, a kernel of this
interpreter registered under that name), on a fresh directory outside the repository that holds
only copies of the notebooks, so that each notebook shows it runs wherever it is saved (it installs
what is missing and writes the files it imports itself); plus what a test needs: ``--no-browser``, a token, a free port on 127.0.0.1, no update check and the app
object exposed to the page. Chromium (``/usr/bin/chromium``, driven by Playwright) loads JupyterLab
once and opens every notebook in it with the ``lightning-anyaccel`` kernel, runs all cells, and the test checks
that every code cell ran without an error output and that every number its text names is one its
code sets or its outputs show (``tests/_notebook_checks.py``). The executed notebook is then stored for the documentation build
(``docs/_ext/notebook_cache.py``), which so does not execute the notebooks a second time.

Every wait is bounded; JupyterLab's process group is killed if it does not shut down. The
static checks at the end (links, the Next link from each notebook to the next, no inline code in
bold, line lengths, the install cell, the recorded run times, unused imports, the files the
notebooks write) need no browser.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.request

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib
from pathlib import Path

import pytest

from lightning_anyaccel.kit.tools.local_runs import free_port

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import notebook_cache  # noqa: E402

from _browser import CHROMIUM, launched_chromium  # noqa: E402
from _notebook_checks import chain_problems, code_in_emphasis, lint, unstated_numbers  # noqa: E402

KERNEL = "lightning-anyaccel"  # the name `make lab` registers
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
START_TIMEOUT_S = 120
RUN_TIMEOUT_S = 540  # per notebook; they take 1-3 minutes on 2 CPU cores
#: longest line of a notebook's code cell that the site shows without a scroll bar
MAX_CODE_LINE = 86
#: notebooks link documentation pages by their hosted URL (conf.py makes them local on the site)
HOSTED_DOCS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Documentation"].rstrip("/") + "/docs/"



def browser_test(test):
    """Marks a test that needs Chromium (skipped, saying so, without it); they are slow."""
    skip = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                              reason=f"no Chromium at {CHROMIUM}: apt-get install -y --no-install-recommends chromium")
    return pytest.mark.slow(skip(test))


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab as ``make lab`` starts it; yields (base URL, token, log file)."""
    tmp = tmp_path_factory.mktemp("lab")
    # the kernel `make lab` registers, here in a private prefix instead of the environment's
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(tmp / "prefix"),
                    "--name", KERNEL, "--display-name", f"Python ({KERNEL})"],
                   check=True, capture_output=True, timeout=120)
    env = {**os.environ,
           "JUPYTER_PATH": str(tmp / "prefix" / "share" / "jupyter"),
           "JUPYTER_CONFIG_DIR": str(tmp / "config"),          # no user settings of this machine
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"),  # no restored layout
           "PYTHONUNBUFFERED": "1"}
    # never save into the repository: no autosave (the test reads the executed notebook from the page)
    settings = tmp / "config" / "lab" / "user-settings" / "@jupyterlab" / "docmanager-extension"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"autosave": False}))
    token, port = secrets.token_hex(16), free_port()
    fresh = tmp / "notebooks"  # outside the repository: nothing next to the notebooks but themselves
    fresh.mkdir()
    for name in NAMES:
        (fresh / name).write_bytes((NOTEBOOKS / name).read_bytes())
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--notebook-dir={fresh}",
           f"--MappingKernelManager.default_kernel_name={KERNEL}",
           "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
           f"--IdentityProvider.token={token}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")  # as `make lab` does for root (CI, containers)
    log_path = tmp / "jupyterlab.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, cwd=fresh, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not answer in {START_TIMEOUT_S}s:\n{log_path.read_text()[-4000:]}")
            time.sleep(1)
        yield base, token, log_path, fresh
        # shut down as a user would (File > Shut Down): the server stops its kernels and exits
        request = urllib.request.Request(f"{base}/api/shutdown", method="POST",
                                         headers={"Authorization": f"token {token}"})
        try:
            urllib.request.urlopen(request, timeout=10).close()
            proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
    finally:
        _kill(proc)
        log.close()


@pytest.fixture(scope="module")
def lab_page(lab):
    """One Chromium page with JupyterLab loaded, shared by the notebooks (a user opens each from the
    file browser of one JupyterLab tab: the app loads once); yields (page, the addresses outside the
    server that the page asked for, which the route refuses)."""
    pytest.importorskip("playwright.sync_api")
    base, token, _, _ = lab
    outside: list[str] = []

    def route(r):
        if r.request.url.startswith(("data:", "blob:")) or r.request.url.startswith(base):
            return r.continue_()
        outside.append(r.request.url)
        return r.abort()

    with launched_chromium() as chromium:
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        try:
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.route("**/*", route)
            page.goto(f"{base}/lab?token={token}", wait_until="load", timeout=120_000)
            page.wait_for_function("() => window.jupyterapp", timeout=120_000, polling=250)
            page.evaluate("async () => { await window.jupyterapp.restored; }")
            yield page, outside
        finally:
            context.close()


#: the notebook panel JupyterLab shows for `name` (the app is exposed as window.jupyterapp)
PANEL_JS = """name => {
    const app = window.jupyterapp;
    if (!app || !app.shell) return null;
    for (const widget of app.shell.widgets('main')) {
        if (widget.context && widget.context.path === name && widget.content && widget.sessionContext) {
            return widget;
        }
    }
    return null;
}"""


@browser_test
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.timeout(RUN_TIMEOUT_S + 180)
def test_notebook_runs_in_jupyterlab(lab, lab_page, name):
    base, token, log_path, fresh = lab
    page, outside = lab_page
    outside.clear()
    on_disk = (fresh / name).read_bytes()
    panel = f"({PANEL_JS})({json.dumps(name)})"
    try:
        # a session with the kernel `make lab` registers, as a user starts one by picking that kernel
        # (the notebooks' metadata names the generic python3, which would start first); JupyterLab
        # opens the notebook in the session its path already has, as File > Open does
        page.evaluate(f"""async () => {{
            const app = window.jupyterapp;
            await app.serviceManager.sessions.startNew({{path: {json.dumps(name)}, name: {json.dumps(name)},
                                                         type: 'notebook', kernel: {{name: {json.dumps(KERNEL)}}}}});
            await app.commands.execute('docmanager:open', {{path: {json.dumps(name)}, factory: 'Notebook'}});
        }}""")
        page.wait_for_function(f"() => {{ const p = {panel}; return p && p.context.isReady && "
                               "p.sessionContext.isReady && p.sessionContext.session; }",
                               timeout=120_000, polling=250)
        page.wait_for_function(f"() => {{ const k = {panel}.sessionContext.session.kernel; "
                               f"return k && k.name === {json.dumps(KERNEL)} && k.status === 'idle'; }}",
                               timeout=120_000, polling=250)
        start = time.monotonic()
        page.evaluate(f"""() => {{
            window.__anyaccelRun = undefined;
            {panel}.content.activate();
            window.jupyterapp.commands.execute('notebook:run-all-cells')
                .then(ok => {{ window.__anyaccelRun = String(ok); }},
                      err => {{ window.__anyaccelRun = 'error: ' + err; }});
        }}""")
        try:
            page.wait_for_function("() => window.__anyaccelRun !== undefined", timeout=RUN_TIMEOUT_S * 1000,
                                   polling=1000)
        except Exception:  # Playwright's TimeoutError: say which cell was running
            running = page.evaluate(f"() => {panel}.content.activeCellIndex")
            pytest.fail(f"{name}: Run All did not finish in {RUN_TIMEOUT_S}s (cell {running} was running)\n"
                        f"{log_path.read_text()[-3000:]}")
        seconds = time.monotonic() - start
        executed = page.evaluate(f"() => {panel}.context.model.toJSON()")
        kernel_name = page.evaluate(f"() => {panel}.sessionContext.session.kernel.name")
    finally:  # free the memory now, and close the tab without saving (the next notebook opens alone)
        page.evaluate(f"""async () => {{ const p = {panel}; if (p) {{
            await p.sessionContext.shutdown(); p.dispose(); }} }}""")
    print(f"{name}: Run All took {seconds:.0f} s with kernel {kernel_name}")
    assert (fresh / name).read_bytes() == on_disk, f"{name} was saved over during the test"
    assert kernel_name == KERNEL
    problems = notebook_cache.problems(executed)
    assert not problems, f"{name}: {problems}"
    unstated = unstated_numbers(executed)
    assert not unstated, f"{name}: numbers in the text that no code sets and no output shows: {unstated}"
    assert not outside, f"{name}: JupyterLab asked for addresses outside the server: {outside[:5]}"
    notebook_cache.store(NOTEBOOKS / name, executed)  # the docs build reuses this run


# ---- static checks: no browser -------------------------------------------------------------


def _cells(name: str, kind: str) -> list[str]:
    nb = json.loads((NOTEBOOKS / name).read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == kind]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_links_work_in_jupyterlab_and_on_the_site(name):
    """Links to notebooks are relative names (JupyterLab and the site both open them); links to
    documentation pages are hosted URLs of pages that exist (the build makes them local)."""
    bad = []
    for text in _cells(name, "markdown"):
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if target.startswith(HOSTED_DOCS):
                page = path[len(HOSTED_DOCS):]
                if not (page.endswith(".html") and (ROOT / "docs" / page.replace(".html", ".md")).exists()):
                    bad.append(f"{target}: no page docs/{page.replace('.html', '.md')}")
            elif target.startswith(("http://", "https://")):
                continue
            elif not (path.endswith(".ipynb") and "/" not in path and (NOTEBOOKS / path).exists()):
                bad.append(f"{target}: use a notebook's name or the hosted URL of a documentation page")
    assert not bad, f"{name}: {bad}"


@pytest.mark.parametrize("name", NAMES)
def test_no_inline_code_in_bold_or_italics(name):
    """``**`torch.compile`**`` shows as ``torch.compile`` with its backticks on the site: nbsphinx turns the Markdown
    into reStructuredText, where inline markup does not nest. Write ``**Compiling** (`torch.compile`)``."""
    notebook = json.loads((NOTEBOOKS / name).read_text(encoding="utf-8"))
    assert code_in_emphasis(notebook) == [], name


def test_the_emphasis_check_finds_code_in_bold_and_lets_the_rest_pass():
    def notebook(text: str) -> dict:
        return {"cells": [{"cell_type": "markdown", "source": text}]}

    assert code_in_emphasis(notebook("- **`torch.compile`**: compiles")) == ["**`torch.compile`**"]
    assert code_in_emphasis(notebook("an *`x` in italics* here")) == ["*`x` in italics*"]
    assert code_in_emphasis(notebook("- **Compiling** (`torch.compile`): `a * b` and `**kwargs`")) == []
    assert code_in_emphasis(notebook("```python\nf(**{'a': `b`})\n```")) == []


def test_the_notebooks_link_each_to_the_next():
    """notebooks/01..: each ends with a ``Next:`` link to the following one, by its title; the last with none."""
    notebooks = {name: json.loads((NOTEBOOKS / name).read_text(encoding="utf-8")) for name in NAMES}
    assert len(notebooks) >= 2 and chain_problems(notebooks) == []


def test_the_chain_check_finds_a_missing_or_wrong_link():
    def notebook(title: str, end: str) -> dict:
        return {"cells": [{"cell_type": "markdown", "source": f"# {title}\n\nText."},
                          {"cell_type": "markdown", "source": f"## What to change\n\n- a point.{end}"}]}

    good = {"01_a.ipynb": notebook("1. A", "\n\nNext: [2. B](02_b.ipynb)."), "02_b.ipynb": notebook("2. B", "")}
    assert chain_problems(good) == []
    missing = {**good, "01_a.ipynb": notebook("1. A", "")}
    assert chain_problems(missing) == ["01_a.ipynb: its last markdown cell must end with"
                                       " 'Next: [2. B](02_b.ipynb).' (found: none)"]
    wrong = {**good, "01_a.ipynb": notebook("1. A", "\n\nNext: [3. C](03_c.ipynb).")}
    assert "found: ['Next: [3. C](03_c.ipynb).']" in chain_problems(wrong)[0]
    last = {**good, "02_b.ipynb": notebook("2. B", "\n\nNext: [1. A](01_a.ipynb).")}
    assert chain_problems(last) == ["02_b.ipynb: the last notebook links a next one (01_a.ipynb)"]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_shows_its_measured_run_time_and_what_to_change(name):
    """The run time in a notebook's header is the one its last run to the end recorded (``start``
    shows it, ``finish`` in the last cell measures it; ``make notebook-times`` records it), never typed."""
    code = _cells(name, "code")
    assert f'start("{name.removesuffix(".ipynb")}")' in code[1], f"{name}: the second cell calls start(...)"
    assert code[-1].strip() == "finish()", f"{name}: the last cell is finish()"
    times = json.loads((ROOT / "src" / "lightning_anyaccel" / "kit" / "tutorial" / "run_times.json").read_text())
    assert times.get(name.removesuffix(".ipynb"), {}).get("cpus") == 2, \
        f"{name}: no run time measured on 2 CPU cores: run `make notebook-times` and commit run_times.json"
    markdown = "\n".join(_cells(name, "markdown"))
    assert "Run time:" not in markdown, f"{name}: a run time typed into the text"
    assert "## What to change" in markdown, f"{name}: no 'What to change' section"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_code_fits_the_page(name):
    # the install line holds the repository's URL whole, so that it can be copied (the site scrolls it)
    cells = _cells(name, "code")[1:]
    long = [line for text in cells for line in text.splitlines() if len(line) > MAX_CODE_LINE]
    assert not long, f"{name}: lines longer than {MAX_CODE_LINE} characters scroll on the site: {long}"


@pytest.mark.parametrize("name", NAMES)
def test_the_linter_passes_on_the_notebook(name):
    """ruff, with the project's rules (pyproject.toml), on a notebook's cells and on each module it writes
    (``%%writefile``, which ruff does not read inside the notebook; pyflakes' rules there, since such a module
    may show a user's program as written): no unused import, no undefined name."""
    assert not lint(f"notebooks/{name}", cwd=ROOT)
    for text in _cells(name, "code"):
        first, _, module = text.partition("\n")
        if first.startswith("%%writefile ") and first.endswith(".py"):
            assert not lint(f"notebooks/{first.split()[-1]}", module, cwd=ROOT, select="F"), f"{name}, {first}"


@pytest.mark.parametrize("name", NAMES)
def test_notebook_installs_what_is_missing_first(name):
    """The first code cell, at most 3 lines, installs the package with its ``tutorial`` extra (from
    pyproject's repository URL) with ``%pip``, only when it is missing: in this environment it does nothing."""
    first = _cells(name, "code")[0]
    assert len(first.strip().splitlines()) <= 3, first
    repository = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
    assert f'%pip install -q "lightning-anyaccel[tutorial] @ git+{repository.rstrip("/")}"' in first, first
    assert "torch" not in first.split("%pip", 1)[1], "never install torch"
    guard = first.split("\n    %pip")[0] + "\n    missing = True\nelse:\n    missing = False"
    namespace: dict = {}
    exec(guard, namespace)  # the guard only: nothing is installed here
    assert namespace["missing"] is False, f"{name} would install the package in this environment"


def _written_files() -> dict[str, dict[str, str]]:
    """Files the notebooks write, file name -> {notebook: content}: ``%%writefile NAME`` cells (Python)
    and ``%%bash`` cells ``cat > NAME <<'EOF' ... EOF`` (shell scripts, so that the site highlights
    them as text rather than as Python)."""
    files: dict[str, dict[str, str]] = {}
    for name in NAMES:
        for text in _cells(name, "code"):
            heredoc = re.fullmatch(r"%%bash\ncat > (\S+) <<'EOF'\n(.*)\nEOF\n?", text, re.S)
            if heredoc:
                files.setdefault(heredoc.group(1), {})[name] = heredoc.group(2)
            elif text.startswith("%%writefile "):
                target, _, content = text.partition("\n")
                files.setdefault(target.split(None, 1)[1], {})[name] = content
    return files


@pytest.mark.parametrize("name", NAMES)
def test_notebook_writes_what_it_imports(name):
    """A notebook imports no module and launches no file that it does not write itself."""
    written = {target for target, by in _written_files().items() if name in by}
    code = "\n".join(_cells(name, "code"))
    for module in re.findall(r"^\s*from (\w+) import", code, re.M):
        if importlib.util.find_spec(module) is None or (NOTEBOOKS / f"{module}.py").exists():
            assert any(t == f"{module}.py" or t.endswith(f"/{module}.py") for t in written), \
                f"{name} imports {module} without writing {module}.py"
    assert "from tutorial" not in code and "../" not in code, f"{name} reads files of the repository"
    copied = set(re.findall(r'copy_script\("([\w./]+)"\)', code))  # from lightning_anyaccel.kit.tutorial
    for script in copied:
        assert (ROOT / "src" / "lightning_anyaccel" / "kit" / "tutorial" / script).is_file(), script
    for script in re.findall(r'"([\w/]+\.(?:py|sh))"', code):
        assert script in written | copied or any(t.endswith(f"/{script}") for t in written | copied), \
            f"{name} launches {script} without writing or copying it"


#: a code cell this long that two notebooks share is a helper to write once (lightning_anyaccel.kit.tutorial)
SHARED_CELL_LINES = 10


def test_the_launch_scripts_ship_once():
    """Notebook 4 shows and runs the repository's launch scripts, shipped with the package (a link to
    ``scripts/launch/``), never a copy typed into a cell."""
    shipped = ROOT / "src" / "lightning_anyaccel" / "kit" / "tutorial" / "launch"
    assert shipped.is_symlink() and shipped.resolve() == (ROOT / "scripts" / "launch").resolve()
    assert not [t for t in _written_files() if t.startswith("launch/")], "a launch script pasted into a notebook"


def test_no_notebook_repeats_another_notebooks_code():
    """No code cell of SHARED_CELL_LINES lines or more stands in two notebooks; the install cell, which
    every notebook needs first to run where it is downloaded, is the one exception."""
    seen: dict[str, str] = {}
    repeated = []
    for name in NAMES:
        for text in _cells(name, "code")[1:]:
            if len(text.strip().splitlines()) < SHARED_CELL_LINES:
                continue
            if text.strip() in seen and seen[text.strip()] != name:
                repeated.append(f"{name} and {seen[text.strip()]}: {text.splitlines()[0]}")
            seen.setdefault(text.strip(), name)
    assert not repeated, repeated


def test_notebooks_write_the_same_files_alike():
    """A file two notebooks write has one content; a launch script is the repository's own
    (``scripts/launch/``, which the scale-out tests run)."""
    for target, by in _written_files().items():
        contents = set(by.values())
        assert len(contents) == 1, f"{target} differs between {sorted(by)}"
        if target.startswith("launch/"):
            repo = (ROOT / "scripts" / target).read_text()
            assert contents.pop().rstrip("\n") == repo.rstrip("\n"), f"{target} differs from scripts/{target}"
