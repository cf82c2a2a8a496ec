"""ThreadSet (transports/threads.py): the one place transports and the discovery agent
start and join their background threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

from amqtransport.transports.threads import ThreadSet


def test_join_all_concurrent_with_spawn_never_sees_an_unstarted_thread() -> None:
    """close() joining while another thread is inside spawn(): the thread being spawned is
    either joined started or not seen at all (it used to be listed before it started, and
    Thread.join raised 'cannot join thread before it is started')."""
    errors: list[BaseException] = []
    holder: list[ThreadSet] = []

    def closer() -> None:
        try:
            holder[0].join_all(timeout=5)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    class CloseRacingThread(threading.Thread):
        def start(self) -> None:
            # a close() arrives between the thread's creation and its start
            racer = threading.Thread(target=closer)
            racer.start()
            racer.join(timeout=0.3)  # it finishes at once if the set lets it in now
            super().start()
            racers.append(racer)

    racers: list[threading.Thread] = []

    def factory(target: Callable[[], None], name: str) -> threading.Thread:
        return CloseRacingThread(target=target, name=name, daemon=True)

    threads = ThreadSet(factory)
    holder.append(threads)
    done = threading.Event()
    threads.spawn(done.set, "worker")
    for racer in racers:
        racer.join(timeout=5)
    assert errors == []
    assert done.wait(5)


def test_join_all_waits_for_the_threads_but_not_for_the_caller() -> None:
    threads = ThreadSet()
    release = threading.Event()
    finished: list[str] = []

    def worker() -> None:
        release.wait(5)
        finished.append("worker")

    def self_joiner() -> None:
        threads.join_all(timeout=5)  # called from one of its own threads: must not wait for itself
        finished.append("self")

    threads.spawn(worker, "worker")
    threads.spawn(self_joiner, "self-joiner")
    release.set()
    threads.join_all(timeout=5)
    assert sorted(finished) == ["self", "worker"]
