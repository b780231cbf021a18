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
