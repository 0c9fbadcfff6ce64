"""The README's Python examples, extracted verbatim and run: the NumPy one (cpu backend) always, the
PyTorch one (on the GPU when this build has the sm90 backend and a GPU, else on the cpu backend)
where PyTorch is installed."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example(marker: str) -> str:
    match = re.search(
        rf"<!-- {marker}:begin -->\s*```python\n(.*?)```\s*<!-- {marker}:end -->",
        README.read_text(),
        re.S,
    )
    assert match, f"README.md: no Python example between the {marker} markers"
    return match.group(1)


def run_example(marker: str) -> None:
    exec(compile(readme_example(marker), f"{README}:{marker}", "exec"), {})


def test_readme_numpy_example():
    code = readme_example("numpy-example")
    assert "torch" not in code, "the NumPy example must run without PyTorch"
    run_example("numpy-example")


def test_readme_python_example():
    pytest.importorskip("torch")
    run_example("python-example")
