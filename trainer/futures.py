"""Futures plumbing shared by turn placement and tool dispatch: one awaited call's results
handed out to the futures of the requests it carried, and a ``gather`` that cancels the rest
when one fails."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def settle(futures: Sequence[asyncio.Future[T]], call: Awaitable[list[T]]) -> None:
    """Await ``call`` (a result per future, in order) and give each future its result, or
    the call's exception. A future already done (its caller gave up) is left alone."""
    try:
        results = await call
    except Exception as exc:
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        return
    for future, result in zip(futures, results, strict=True):
        if not future.done():
            future.set_result(result)


# ---------------------------------------------------------------------------- drivers


async def gather_all(coroutines: Sequence[Awaitable[T]]) -> list[T]:
    """``gather`` that cancels the rest when one fails (asyncio.TaskGroup is Python 3.11+)."""
    tasks = [asyncio.ensure_future(c) for c in coroutines]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
