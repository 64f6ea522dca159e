"""The engine loop builds its engine on the thread that steps it (serve/engine_loop.py says why), and a
failure to build reaches the caller of start()."""

import threading

import pytest

from rollout_engine import SamplingParams
from serve.engine_loop import EngineLoop
from tests.helpers.live_server import tiny_engine


def test_the_engine_is_built_and_stepped_on_the_loops_own_thread(tiny):
    built_on, stepped_on, done = [], [], threading.Event()

    def build():
        built_on.append(threading.get_ident())
        return tiny_engine(*tiny)

    def sink(item):
        assert not isinstance(item, BaseException), item
        stepped_on.append(threading.get_ident())
        if any(token.finish_reason is not None for token in item):
            done.set()

    loop = EngineLoop(build)
    engine = loop.start()
    assert loop.engine is engine and built_on  # built before start() returned
    loop.submit(tiny[1].encode("Once upon a time"), SamplingParams(temperature=0, max_tokens=4), sink)
    assert done.wait(timeout=60), "the request did not finish"
    loop.stop()
    assert stepped_on and set(stepped_on) == set(built_on) and built_on[0] != threading.get_ident()


def test_a_failure_to_build_is_raised_by_start_and_ends_the_thread():
    failure = ValueError("model.path=/nowhere: no such model")

    def build():
        raise failure

    loop = EngineLoop(build)
    with pytest.raises(ValueError) as raised:
        loop.start()
    assert raised.value is failure and loop.engine is None
    assert not loop._thread.is_alive()
