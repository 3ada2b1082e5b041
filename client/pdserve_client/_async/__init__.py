"""The one source of both clients: `client.py` here is the asyncio client, and
client/gen_sync.py turns it into `_sync/client.py` with unasync; `_shims.py` holds
what differs beyond a rename, with its blocking twin in `_sync/_shims.py`."""
