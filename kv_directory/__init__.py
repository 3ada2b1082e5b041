"""KV directory: worker registry, transfer transactions, prefix index, route epoch.

Logic and storage only; the gRPC servicer (``server.py``) maps RPCs onto a
``DirectoryStore``. ``RedisDirectoryStore`` is the real one,
``MemoryDirectoryStore`` the in-process one for unit tests.
"""
