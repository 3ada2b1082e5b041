"""`python -m decode_worker`: a decode worker process.

With `--serve-prefill` (PD_SERVE_PREFILL=1) the same process also serves
pd.v1.Prefill on its engine and registers as role mixed: the router may then
run a colocated request here, decode a split one here, or prefill a split one
here for another decode worker. Prefill-only jobs and decode steps share the
engine loop (one prefill chunk, then one decode step), as colocated requests do.
"""

from __future__ import annotations

import logging

from prefill_worker.server import PrefillServicer
from prefill_worker.worker import PrefillWorker
from services.common.grpc_server import setup_logging, start_server, wait_for_shutdown
from services.directory.client import DirectoryClient
from services.directory.records import LoadReport, WorkerInfo, WorkerRole
from services.rpc.pd.v1 import decode_pb2_grpc, prefill_pb2_grpc
from services.worker.directory_ops import TxnOps
from services.worker.membership import Membership
from services.worker.process import (
    advertised,
    block_counts,
    build_engine_loop,
    build_receiver,
    build_sender,
    capacity,
    metrics_file,
    parse_config,
    run_process,
)
from services.worker.profile import ProfileConfig, active_context_tokens, obtain

from .server import DecodeServicer
from .worker import DecodeWorker

log = logging.getLogger("decode_worker")


async def run(argv: list[str] | None = None) -> None:
    cfg, log_level = parse_config("decode", argv)
    setup_logging(cfg.worker_id, log_level)
    loop, check = build_engine_loop(cfg)
    loop.start()
    profile_cfg = ProfileConfig.from_env()
    profile = await loop.call(lambda e: obtain(e, profile_cfg))  # before serving: nothing else runs yet
    receiver = build_receiver(cfg)
    await receiver.start()
    directory = DirectoryClient(cfg.directory_addr, cfg.rpc_timeout_s)
    membership: Membership | None = None
    txn = TxnOps(directory, cfg.worker_id, lambda: membership.epoch)
    worker = DecodeWorker(cfg, loop, receiver, txn)
    servicer = DecodeServicer(worker, cfg.worker_id, lambda: membership.epoch if membership else 0)
    services = [(decode_pb2_grpc.add_DecodeServicer_to_server, servicer, "pd.v1.Decode")]
    sender = None
    if cfg.serve_prefill:
        sender = build_sender(cfg)
        await sender.start()
        prefill = PrefillWorker(cfg, loop, sender, txn)
        services.append((prefill_pb2_grpc.add_PrefillServicer_to_server, PrefillServicer(prefill),
                         "pd.v1.Prefill"))
    server, port, health = await start_server(cfg.listen, services)

    def load() -> LoadReport:
        e = loop.engine
        return LoadReport(
            pending_prefill_tokens=loop.pending_prefill_tokens, active_decode_batch=loop.active_decode,
            active_context_tokens=active_context_tokens(loop),
            **block_counts(e, worker.reserved_blocks()))

    membership = Membership(
        directory, WorkerInfo(cfg.worker_id, WorkerRole.MIXED if sender else WorkerRole.DECODE,
                              advertised(cfg, port),
                              receiver.address, loop.engine.abi.digest, capacity(cfg, loop), profile,
                              check.reason),
        load, on_lease_lost=lambda: worker.abort_all_unpublished("lease lost"))
    await membership.start()
    metrics = metrics_file(cfg, loop, receiver, *([sender] if sender else []))
    metrics.start()
    log.info("%s worker %s serving on %s, data plane %s", "mixed" if sender else "decode",
             cfg.worker_id, advertised(cfg, port), receiver.address)

    async def on_stop():
        await metrics.stop()
        await worker.abort_all_unpublished("worker shutting down")
        await membership.stop()
        await receiver.stop()
        if sender is not None:
            await sender.close()
        await directory.close()
        loop.stop()

    await wait_for_shutdown(server, health, on_stop=on_stop)


def main() -> None:
    run_process(run)


if __name__ == "__main__":
    main()
