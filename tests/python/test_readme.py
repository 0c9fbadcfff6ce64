"""The README's Python example, extracted verbatim and run (on the cpu backend unless this build has
the sm90 backend and a GPU). Skipped without PyTorch."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example():
    pytest.importorskip("torch")
    text = README.read_text()
    match = re.search(
        r"<!-- python-example:begin -->\s*```python\n(.*?)```\s*<!-- python-example:end -->",
        text,
        re.S,
    )
    assert match, "README.md: no Python example between the python-example markers"
    exec(compile(match.group(1), str(README), "exec"), {})
