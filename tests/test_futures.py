import asyncio
import threading

import pytest

from rlkit.futures import APIFuture


def test_result_done_and_exception():
    f = APIFuture(operation="x")
    assert not f.done()
    threading.Timer(0.01, lambda: f.set_result(5)).start()
    assert f.result(timeout=5) == 5 and f.done() and f.exception() is None


def test_error_is_reraised():
    f = APIFuture()
    f.set_exception(ValueError("boom"))
    assert isinstance(f.exception(), ValueError)
    with pytest.raises(ValueError, match="boom"):
        f.result()


def test_await_and_then():
    f = APIFuture()
    g = f.then(lambda v: v * 2)
    threading.Timer(0.01, lambda: f.set_result(21)).start()

    async def main():
        return await g

    assert asyncio.run(main()) == 42


def test_timeout():
    import concurrent.futures

    with pytest.raises(concurrent.futures.TimeoutError):
        APIFuture().result(timeout=0.01)
