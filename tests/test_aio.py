"""The asyncio face shares the core: await put/get over a real loopback connection."""

import asyncio

import pytest

import netq as nq
import netq.aio


def test_await_put_and_get_round_trip():
    async def main():
        server = netq.aio.new(purpose="server", options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(port=0)))
        port = server.communicator.address[1]
        async with netq.aio.new(purpose="client", options=nq.CommunicatorOptions(
                netloc=nq.NetworkLocation(port=port))) as client:

            async def echo():
                for _ in range(100):
                    message = await server.get(timeout=10)
                    await server.put(("echo", message.data), message.peer)

            task = asyncio.create_task(echo())
            for i in range(100):
                await client.put(i)
                assert (await client.get(timeout=10)).data == ("echo", i)
            await task
            with pytest.raises(nq.Empty):
                await client.get(timeout=0.05)
            delivered = client.put_nowait("last")
            await delivered
            assert (await server.get(timeout=10)).data == "last"
        await server.close()

    asyncio.run(main())


def test_many_concurrent_getters_do_not_block_the_loop():
    async def main():
        server = netq.aio.new(purpose="server", options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(port=0)))
        port = server.communicator.address[1]
        client = netq.aio.new(purpose="client", options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(port=port)))
        getters = [asyncio.create_task(server.get(timeout=10)) for _ in range(20)]
        # The loop keeps running while all 20 wait: this sleep returns. It also lets them
        # start waiting first; one that had not would still get its message (only later).
        await asyncio.sleep(0.05)
        await client.put_many(range(20))
        values = sorted([(await task).data for task in getters])
        assert values == list(range(20))
        await client.close()
        await server.close()

    asyncio.run(main())


@pytest.mark.timeout(60)
def test_an_awaited_get_with_no_client_says_so(caplog):
    """``await server.get()`` waits outside get(): it says what for like a blocking one."""
    caplog.set_level("WARNING", logger="netq")

    async def main():
        server = netq.aio.new(purpose="server", options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(port=0),
            connection=nq.ConnectionOptions(stall_warning=0.5)))
        waiting = asyncio.create_task(server.get())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not server.communicator.statistics().get_waiting:  # a bounded poll
            assert loop.time() < deadline, "statistics() never said that get() waits"
            await asyncio.sleep(0.02)
        assert "no client is connected" in server.communicator.statistics().get_waiting
        while not any("get() waits and has returned" in r.getMessage() for r in caplog.records):
            assert loop.time() < deadline, "no warning that get() waits"
            await asyncio.sleep(0.02)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert server.communicator.statistics().get_waiting == ""  # the wait ended with it
        await server.close()

    asyncio.run(main())


def test_an_awaited_get_that_times_out_says_whom_it_waited_for():
    async def main():
        server = netq.aio.new(purpose="server", options=nq.CommunicatorOptions(
            netloc=nq.NetworkLocation(port=0)))
        with pytest.raises(nq.Empty, match=r"get\(timeout=0.05\) found no message in 0.05 s; "
                                           r"no client is connected$"):
            await server.get(timeout=0.05)
        await server.close()

    asyncio.run(main())


def test_the_async_face_shows_what_the_communicator_shows():
    """What a notebook cell asks of a communicator: where it listens, its state, its repr and
    its view; get_many() awaits the first message and takes what else is there."""
    async def main():
        server = netq.aio.new("TCP", "server", nq.CommunicatorOptions(netloc=("127.0.0.1", 0)))
        port = server.address[1]
        assert server.purpose is nq.Purpose.SERVER and server.protocol is nq.Protocol.TCP
        assert server.options.netloc.port == 0 and not server.closed
        assert repr(server).startswith(f"<async netq server tcp 127.0.0.1:{port} id=")
        assert server.statistics().address == f"127.0.0.1:{port}"
        bundle = server._repr_mimebundle_()
        assert "text/plain" in (bundle[0] if isinstance(bundle, tuple) else bundle)
        async with netq.aio.new("tcp", "client", nq.CommunicatorOptions(
                netloc=("127.0.0.1", port))) as client:
            waiting = asyncio.create_task(server.get_many(timeout=10))
            await asyncio.sleep(0)  # the get_many starts (waiting or not yet: both are checked)
            await client.put_many(["a", "b", "c"])
            first = await waiting
            assert [message.data for message in first][:1] == ["a"]
            rest = [] if len(first) == 3 else await server.get_many(timeout=10)
            assert [message.data for message in first + rest] == ["a", "b", "c"]
            await client.put_many(["d", "e"])
            assert [m.data for m in await server.get_many(max_messages=1, timeout=10)] == ["d"]
            assert [m.data for m in await server.get_many(timeout=10)] == ["e"]
            with pytest.raises(nq.Empty):
                await server.get_many(timeout=0.05)
        await server.close()
        assert server.closed

    asyncio.run(main())
