"""``cancel_and_wait`` ends a task whose cancel Python 3.11's ``wait_for`` swallowed."""

from __future__ import annotations

import asyncio

from amqtransport.tasks import cancel_and_wait


def test_a_task_that_swallows_its_first_cancel_is_cancelled_again_until_it_ends() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        inner: list[asyncio.Future[None]] = []
        turns = 0

        async def loops_on_refusals() -> None:
            nonlocal turns
            while True:
                turns += 1
                fut: asyncio.Future[None] = loop.create_future()
                inner.append(fut)
                try:
                    await asyncio.wait_for(fut, 60.0)
                except OSError:
                    pass  # refused: look again
                await asyncio.sleep(0.01)

        task = loop.create_task(loops_on_refusals())
        while not inner:
            await asyncio.sleep(0)
        inner[-1].set_exception(ConnectionRefusedError(111, "refused"))  # in the cancel's turn
        await asyncio.wait_for(cancel_and_wait(task), 2.0)
        assert task.cancelled() and turns >= 2  # it did swallow one cancel, and still ended

    asyncio.run(scenario())


def test_done_and_failed_tasks_are_fine_and_their_errors_retrieved() -> None:
    async def scenario() -> None:
        async def fails() -> None:
            raise ValueError("boom")

        loop = asyncio.get_running_loop()
        failed = loop.create_task(fails())
        await asyncio.sleep(0)
        sleeper = loop.create_task(asyncio.sleep(10))
        await cancel_and_wait(failed, sleeper)
        assert failed.done() and not failed.cancelled() and sleeper.cancelled()
        await cancel_and_wait()  # nothing to do

    asyncio.run(scenario())


def test_cancelling_the_caller_cancels_the_caller() -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        stubborn_for = 10**9  # cancels it swallows: all, until the test lets it go

        async def stubborn() -> None:
            nonlocal stubborn_for
            while True:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    stubborn_for -= 1
                    if stubborn_for < 0:
                        raise

        task = loop.create_task(stubborn())
        await asyncio.sleep(0)
        waiter = loop.create_task(cancel_and_wait(task, every=0.01))
        await asyncio.sleep(0.05)
        waiter.cancel()
        done, _ = await asyncio.wait([waiter], timeout=2.0)
        assert waiter in done and waiter.cancelled()
        assert not task.done()
        stubborn_for = 0
        await asyncio.wait_for(cancel_and_wait(task, every=0.01), 2.0)
        assert task.cancelled()

    asyncio.run(scenario())
