"""Harness of the data-plane integration tests (tests/integration/test_transfer*.py):
real processes (tests/support/spawned.py; loopback, ucx over shared memory:
endpoints from worker addresses), each serving one side's commands:

    R   decode side (receiver.py): engines, a receiver; reserves a sequence, expects
        the transfer, and on commit validates (every chunk arrived once with the
        manifest's checksum, kv_digest equal) -> commit_import -> decodes
    S   prefill side (sender.py): engines, a sender; prefills, sends chunks,
        commits, and continues decoding itself (the reference tokens)
    LS, LR  light sender / receiver without an engine, started per test to be
        killed (SIGKILL) or frozen (SIGSTOP)

R and S build the same engines (engines.py). The fixtures (fixtures.py: `procs`, R
and S per backend, module-scoped; `light`; and the autouse `receiver_clean`: after
every test R holds no pending transfer and no block, and S's credit windows hold no
credit; neither keeps anything of an ended transfer: kept.py) are imported by the test
modules, with the helpers that drive a transfer.
"""
