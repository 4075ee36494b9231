"""``tokentrail intercept`` serves on uvloop and httptools, named, not left to uvicorn's "auto"."""

from __future__ import annotations

import argparse
import importlib

from producers import cli


def test_the_interceptor_names_the_c_event_loop_and_http_parser(monkeypatch):
    # Left to "auto", a venv without them runs the asyncio loop and h11 silently, at ~1 ms more
    # CPU per captured call (docs/perf/interceptor.md); named, a missing install fails at start.
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    seen: dict = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: seen.update(kw))
    monkeypatch.setattr("producers.logs.configure_logging", lambda *a, **k: None)
    monkeypatch.setattr("gc.freeze", lambda: None)
    monkeypatch.setattr("gc.set_threshold", lambda *a: None)
    assert cli.main(parser.parse_args(["--upstream", "http://e", "--bootstrap", "k:9092"])) == 0
    assert (seen["loop"], seen["http"]) == ("uvloop", "httptools")
    for module in ("uvloop", "httptools"):  # declared dependencies, installed by `make install`
        importlib.import_module(module)
