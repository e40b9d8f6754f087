"""`on_passing_thread`: the model loaded on a thread that has ended by the time the server answers with it."""

import threading

import pytest

from typedlm.hosting.threads import on_passing_thread


def test_runs_on_a_thread_that_has_ended_when_it_returns():
    ran_on = []

    def load():
        ran_on.append(threading.current_thread())
        return "the model"

    assert on_passing_thread(load) == "the model"
    assert ran_on[0] is not threading.current_thread()
    assert not ran_on[0].is_alive()


def test_its_error_is_raised_on_the_callers_thread():
    def load():
        raise FileNotFoundError("no such model")

    with pytest.raises(FileNotFoundError, match="no such model"):
        on_passing_thread(load)


def test_an_interrupt_while_loading_reaches_the_caller():
    def load():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        on_passing_thread(load)
