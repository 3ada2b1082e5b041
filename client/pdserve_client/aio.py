"""asyncio pdserve client: the same calls as `client.Client`, awaited.

    async with AsyncClient("127.0.0.1:50080") as client:
        async for token in client.generate(prompt="Hello", max_tokens=16):
            print(token.text, end="", flush=True)
        options = GenerateOptions(max_tokens=8, temperature=0.7, seed=1)
        result = await client.generate_full(prompt_ids=[1, 2, 3], options=options)

The channel is created on first use, inside the running event loop. Leaving
a stream early (break, `aclose()`, `async with` ending, garbage collection)
cancels the gRPC call, which the router sees as a cancelled request.

The code is `_async/client.py`, the one source both clients are made from.
"""

from pdserve_client._async.client import AsyncClient, AsyncTokenStream
from pdserve_client.options import GenerateOptions

__all__ = ["AsyncClient", "AsyncTokenStream", "GenerateOptions"]
