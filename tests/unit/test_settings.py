"""Every process's settings model refuses a bad value before any I/O, naming the field, the value and the fix."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from consumers.settings import ConsumerSettings
from processors.settings import ProcessorSettings
from producers.settings import InterceptorSettings

MODELS = {
    "interceptor": lambda **kw: InterceptorSettings(upstream_url="http://127.0.0.1:8000", **kw),
    "processor": lambda **kw: ProcessorSettings(**kw),
    "consumer": lambda **kw: ConsumerSettings(**kw),
}


@pytest.mark.parametrize("process", sorted(MODELS))
@pytest.mark.parametrize("bootstrap", ["", "localhost", "a:1,b"])
def test_a_bootstrap_without_ports_is_refused_with_the_value_and_the_form(process, bootstrap):
    with pytest.raises(ValidationError) as err:
        MODELS[process](bootstrap=bootstrap)
    text = str(err.value)
    assert "bootstrap" in text and repr(bootstrap) in text and "host:port" in text


@pytest.mark.parametrize("process", sorted(MODELS))
def test_unknown_settings_are_refused(process):
    with pytest.raises(ValidationError, match="no_such_setting"):
        MODELS[process](bootstrap="127.0.0.1:9092", no_such_setting=1)


@pytest.mark.parametrize("process", sorted(MODELS))
def test_a_broker_list_is_accepted(process):
    assert MODELS[process](bootstrap="k1:9092,k2:9092").bootstrap == "k1:9092,k2:9092"
