"""Issue 30: the documentation site builds with ``mkdocs build --strict`` (zero warnings), and every ``python`` code
block of its pages runs (blocks of one page in order, in one namespace), so the examples cannot rot. The
``torch.compile`` example compiles with the ``eager`` backend here (dynamo still traces it with fullgraph=True;
inductor's C++ compile would take most of the time budget); the ``torchrun`` example runs as one process."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import require

pytestmark = pytest.mark.slow  # a long file: scheduled first (tests/conftest.py)

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(p for p in DOCS.glob("*.md") if BLOCK.search(p.read_text()))


def docs_hooks():
    """docs/hooks.py as a module (it imports mkdocs only inside the hooks)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks


def api_modules() -> tuple[str, ...]:
    """The public modules the API page documents (``API_MODULES`` of docs/hooks.py)."""
    return docs_hooks().API_MODULES


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for the checks below with ``mkdocs build --strict`` (a warning fails it)."""
    for module in ("mkdocs", "mkdocstrings", "material"):
        require(module, "docs")
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    cmd = [mkdocs] if mkdocs else [sys.executable, "-m", "mkdocs"]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    out = tmp_path_factory.mktemp("docs") / "site"
    res = subprocess.run(
        [*cmd, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stderr, res.stderr
    return out


def test_docs_build_strict(site):
    api = (site / "api" / "index.html").read_text()
    for module in api_modules():  # the API reference documents every public name of every public module
        for name in importlib.import_module(module).__all__:
            assert f'id="{module}.{name}"' in api, f"{module}.{name}"
    cli = (site / "cli" / "index.html").read_text()
    assert "qkernels train" in cli and "--resume" in cli


# ----------------------------------------------------------------------------- a readable API page (issue 39 item 2)
def _section(api: str, identifier: str) -> str:
    """The HTML of one object's documentation on the API page: from its heading to the next heading."""
    start = api.index(f'id="{identifier}"')
    end = re.compile(r"<h[2-5] id=").search(api, start)
    return api[start : end.start() if end else len(api)]


def test_one_signature_per_object(site):
    """``cliff_loss`` has typing overloads: the page shows the implementation's signature only."""
    api = (site / "api" / "index.html").read_text()
    assert "doc-overloads" not in api
    assert _section(api, "qkernels.cliff_loss").count('class="doc-signature') == 1
    for chunk in re.split(r"<h[2-5] id=", api):
        assert chunk.count('class="doc-signature') <= 1, chunk[:80]


def test_site_has_no_raw_sphinx_roles(site):
    """The docstrings' roles (``:func:`x```) reach the page as links or inline code (docs/xrefs.py), never as text."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    for page in pages:
        raw = re.findall(r".{0,40}:(?:func|class|mod|meth|data|attr):.{0,40}", page.read_text())
        assert not raw, f"{page.relative_to(site)}: {raw[:3]}"


def test_roles_link_where_the_site_documents_the_target(site):
    api = (site / "api" / "index.html").read_text()
    link = r'<a class="autorefs autorefs-internal"[^>]*href="{href}"[^>]*><code>{text}</code></a>'
    cliff = _section(api, "qkernels.cliff_loss")  # :class:`CliffTerms`, a short name in cliff_loss's module
    assert re.search(link.format(href="#qkernels.CliffTerms", text="CliffTerms"), cliff), cliff
    fsq = _section(api, "qkernels.nn.FSQ")  # :class:`~qkernels.Quantized`: the last component shown
    assert re.search(link.format(href="#qkernels.Quantized", text="Quantized"), fsq)
    nhp = _section(api, "qkernels.nn.NormalizedHessianPenalty")  # a canonical path links to the public name
    path = "qkernels.ops.hessian.normalized_hessian_penalty"
    assert re.search(link.format(href="#qkernels.normalized_hessian_penalty", text=re.escape(path)), nhp)
    # a target without a section on the site (a private module) is inline code, not a link to nowhere
    klm = _section(api, "qkernels.klm_loss")
    assert re.search(r"<span[^>]*><code>qkernels\._precision</code></span>", klm), klm


def test_site_serves_its_math_renderer(site):
    """Equations render offline: no page loads a script from the network; MathJax (entry point and fonts) is in the
    site, copied by docs/hooks.py from the sphinx-mathjax-offline package."""
    where = docs_hooks().MATHJAX
    mathjax = site / where
    assert (mathjax / "tex-mml-chtml.js").is_file(), f"no MathJax in the site ({where})"
    assert (mathjax / "tex-mml-chtml.js").stat().st_size > 100_000
    assert list((mathjax / "output" / "chtml" / "fonts" / "woff-v2").glob("MathJax_Main-Regular.woff"))
    for page in site.rglob("*.html"):
        scripts = re.findall(r"<script[^>]*\ssrc=\"([^\"]*)\"", page.read_text())
        remote = [src for src in scripts if re.match(r"(https?:)?//", src)]
        assert not remote, f"{page.relative_to(site)} loads {remote}"
    kde = (site / "kde" / "index.html").read_text()  # a page with equations
    assert 'class="arithmatex"' in kde
    assert re.search(rf'<script[^>]*src="\.\./{re.escape(where)}/tex-mml-chtml\.js"', kde)


def test_every_page_with_code_has_blocks():
    assert {p.name for p in PAGES} >= {"index.md", "kde.md", "quantization.md", "hessian.md", "training-code.md"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_code_blocks_run(page, monkeypatch, tmp_path):
    real_compile = torch.compile

    def eager_compile(fn=None, **kw):
        kw["backend"] = "eager"
        return real_compile(fn, **kw) if fn is not None else lambda f: real_compile(f, **kw)

    monkeypatch.setattr(torch, "compile", eager_compile)
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    # a port free now (a page's fixed default, training-code.md's 29531, may be held by another process or test)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    namespace = {"__name__": f"docs_{page.stem}"}
    # the environment put back whole afterwards: a page's example sets variables (training-code.md: MASTER_ADDR and
    # MASTER_PORT), which delenv of an unset variable does not undo
    with mock.patch.dict(os.environ):
        for i, block in enumerate(BLOCK.findall(page.read_text())):
            try:
                exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
            except Exception as err:  # noqa: BLE001 - name the page and block
                raise AssertionError(f"{page.name}, python block {i} failed: {err!r}\n{block}") from err
    torch._dynamo.reset()


@pytest.mark.parametrize("block", range(len(BLOCK.findall((ROOT / "README.md").read_text()))))
def test_readme_code_blocks_run(block, monkeypatch, tmp_path):
    """Issue 57, item 6: every python block of the README runs as written (its JAX example used names it never
    defined). The JAX block is docs/jax.md's example, word for word, which test_docs_code_blocks_run[jax.md] runs
    (its compiles take seconds: run once); the others run here."""
    code = BLOCK.findall((ROOT / "README.md").read_text())[block]
    if "qkernels.jax" in code:
        assert code in BLOCK.findall((DOCS / "jax.md").read_text()), "the README's JAX block is not docs/jax.md's"
        return
    monkeypatch.chdir(tmp_path)
    try:
        exec(compile(code, f"README.md[block {block}]", "exec"), {"__name__": "readme"})
    except Exception as err:  # noqa: BLE001 - name the block
        raise AssertionError(f"README.md, python block {block} failed: {err!r}\n{code}") from err
