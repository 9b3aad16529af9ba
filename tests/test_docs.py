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
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PAGES = sorted(p for p in DOCS.glob("*.md") if BLOCK.search(p.read_text()))


def api_modules() -> tuple[str, ...]:
    """The public modules the API page documents (``API_MODULES`` of docs/hooks.py)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    return hooks.API_MODULES


def test_docs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("material")
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable)) or shutil.which("mkdocs")
    cmd = [mkdocs] if mkdocs else [sys.executable, "-m", "mkdocs"]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([*cmd, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "WARNING" not in res.stderr, res.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for module in api_modules():  # the API reference documents every public name of every public module
        for name in importlib.import_module(module).__all__:
            assert f'id="{module}.{name}"' in api, f"{module}.{name}"
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "qkernels train" in cli and "--resume" in cli


def test_every_page_with_code_has_blocks():
    assert {p.name for p in PAGES} >= {"index.md", "kde.md", "quantization.md", "hessian.md", "training-code.md"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_code_blocks_run(page, monkeypatch, tmp_path):
    real_compile = torch.compile

    def eager_compile(fn=None, **kw):
        kw["backend"] = "eager"
        return real_compile(fn, **kw) if fn is not None else lambda f: real_compile(f, **kw)

    monkeypatch.setattr(torch, "compile", eager_compile)
    monkeypatch.chdir(tmp_path)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    namespace = {"__name__": f"docs_{page.stem}"}
    for i, block in enumerate(BLOCK.findall(page.read_text())):
        try:
            exec(compile(block, f"{page.name}[block {i}]", "exec"), namespace)
        except Exception as err:  # noqa: BLE001 - name the page and block
            raise AssertionError(f"{page.name}, python block {i} failed: {err!r}\n{block}") from err
    torch._dynamo.reset()
