"""The blocking client: `client.py` is generated from `_async/client.py` (client/gen_sync.py;
do not edit it), `_shims.py` is written by hand, the twin of `_async/_shims.py`."""
