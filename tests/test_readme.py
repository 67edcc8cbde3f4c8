"""The README's code runs: every ```python block after a `<!-- runs in tests/test_readme.py -->`
marker is executed (in a fresh temporary folder, as a user would run it), so the README cannot
go stale; and it stays a page for users (at most 250 lines)."""

import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"<!-- runs in tests/test_readme.py -->\n```python\n(.*?)```",
                    README.read_text(), re.S)


def test_readme_is_short_and_has_its_runnable_blocks():
    assert len(README.read_text().splitlines()) <= 250
    assert len(BLOCKS) == 2


@pytest.mark.parametrize("code", BLOCKS, ids=["api", "changing a kernel"])
def test_readme_block_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    from numba_flash import registry
    before = set(registry.PAIRS)
    try:
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    finally:
        for name in set(registry.PAIRS) - before:
            registry.unregister(name)
    assert os.getcwd() == str(tmp_path)
