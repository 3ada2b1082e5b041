"""The pd.v1 stub generator (`make proto`, gen.py) and the field-number lock. The
stubs themselves are written into the client distribution
(client/pdserve_client/rpc/pd/v1), which every process imports them from."""
