"""``tokentrail bench``: every public module of the package is a benchmark the CLI can run."""

from __future__ import annotations

import importlib

import pytest

from compose.cli import build_parser
from compose.tools import bench


def test_every_benchmark_module_has_configure_and_main():
    names = bench._benchmarks()
    assert {"budgets", "capture", "e2e", "fold", "interceptor", "memory", "rebuild", "wire"} <= set(names)
    for name in names:
        module = importlib.import_module(f"compose.tools.bench.{name}")
        assert callable(getattr(module, "configure", None)) and callable(getattr(module, "main", None)), (
            f"compose/tools/bench/{name}.py is listed as a benchmark: helpers' names start with '_'")


@pytest.mark.parametrize("argv", [["bench", "wire", "--calls", "3"], ["bench", "interceptor", "--profile", "p.raw"],
                                  ["bench", "budgets", "--only", "wire"]])
def test_the_bench_commands_parse(argv):
    args = build_parser(argv).parse_args(argv)
    assert args._bench_module.__name__.endswith(argv[1])


def test_every_row_of_make_bench_runs_a_benchmark_with_arguments_it_takes():
    from compose.tools.bench.budgets import BENCHES

    assert "interceptor-stream" in BENCHES  # the streamed proxied call, as the CLI harnesses make them
    for label, extra in BENCHES.items():
        argv = ["bench", label.split("-")[0], *extra]
        args = build_parser(argv).parse_args(argv)  # an unknown option or a bad value exits here
        assert args._bench_module.__name__.endswith(argv[1]), label
