"""Which thread runs the model's CPU work.

On a CPU, torch runs an operator's parallel part on OpenMP worker threads, and OpenMP (GNU libgomp, which torch's
Linux builds ship) keeps one team of workers per thread that has ever started such a part, for as long as that
thread lives. Once the teams together hold more threads than the machine has cores, libgomp stops letting its idle
workers spin and puts them to sleep after every parallel part, and waking them costs each of the forward's many
small operators a system call: measured on a 2-core machine, one process's forwards (a tiny model, 32 questions,
a cached document) took 18 ms while only its main thread had used OpenMP, 27-29 ms once a second live thread had,
and 18 ms again once that thread had ended.

A server loads its model on one thread and answers on another (the model worker's), so the loading is done on a
thread that ends when it is done (`on_passing_thread`), and only the model thread keeps a team.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[[], T], name: str = "typedlm-load") -> T:
    """`fn()` on a new thread, joined before this returns: its result, or its exception raised here. The OpenMP
    workers that `fn` started end with that thread. A daemon thread: Ctrl-C while it runs ends the wait here, and
    the process does not wait for `fn` to finish before it exits."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append((True, fn()))
        except BaseException as exc:  # handed to the caller, raised on its thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
