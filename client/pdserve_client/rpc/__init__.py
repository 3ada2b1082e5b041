"""Generated gRPC/protobuf stubs for the pd.v1 contract (sources in proto/pd/v1 of
the pdserve repository). Import them as a normal package::

    from pdserve_client.rpc.pd.v1 import router_pb2, router_pb2_grpc

Modules: ``common_pb2``, ``manifest_pb2``, ``directory_pb2(_grpc)``,
``prefill_pb2(_grpc)``, ``decode_pb2(_grpc)``, ``router_pb2(_grpc)``,
``admin_pb2(_grpc)``; each ``_pb2`` has a ``.pyi`` beside it for type checkers.
Everything under ``pd/`` is written by ``make proto`` (``python -m tooling.gen_stubs``);
edit the .proto files, never the stubs. The stubs live in the client distribution so
that a client needs nothing else; the server imports them from here too.
"""
