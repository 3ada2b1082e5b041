"""Synchronous pdserve client: Generate as an iterator of tokens, Cancel, and Admin calls.

    with Client("127.0.0.1:50080") as client:
        for token in client.generate(prompt="Hello", max_tokens=16):
            print(token.text, end="", flush=True)
        options = GenerateOptions(max_tokens=8, temperature=0.7, seed=1)
        result = client.generate_full(prompt_ids=[1, 2, 3], options=options)
        print(result.ttft_ms, result.tpot_ms, result.route)

Every failure is a `PdError`. Leaving a token stream early (break, `close()`,
the `with` block ending, or the stream being garbage-collected) cancels the
gRPC call, which the router sees as a cancelled request. A Client may be shared
by threads.

The code is `_sync/client.py`, generated from the asyncio client
(`_async/client.py`) by client/gen_sync.py; edit that one, then `make sync-client`.
"""

from pdserve_client._sync.client import Client, TokenStream
from pdserve_client.options import GenerateOptions

__all__ = ["Client", "GenerateOptions", "TokenStream"]
