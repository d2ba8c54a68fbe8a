"""Shared by the benchmark scripts' tests: `benchmarks/` is a folder of scripts, not a package."""

import importlib.util
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def benchmark_module():
    """load(name) -> the module of benchmarks/<name>.py, loaded from its file."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
