"""`python -m prefill_worker`: a prefill worker process."""

from __future__ import annotations

import logging

import grpc

from services.common.grpc_server import setup_logging, start_server, wait_for_shutdown
from services.rpc.pd.v1 import common_pb2, prefill_pb2_grpc
from services.transfer.factory import make_sender
from services.worker.directory_ops import TxnOps
from services.worker.membership import Membership
from services.worker.process import (advertised, build_engine_loop, capacity, parse_config,
                                     run_process)

from .server import PrefillServicer
from .worker import PrefillWorker

log = logging.getLogger("prefill_worker")


async def run(argv: list[str] | None = None) -> None:
    cfg, log_level = parse_config("prefill", argv)
    setup_logging(cfg.worker_id, log_level)
    loop = build_engine_loop(cfg)
    loop.start()
    sender = make_sender(cfg.transport)
    channel = grpc.aio.insecure_channel(cfg.directory)
    membership: Membership | None = None
    txn = TxnOps(channel, cfg.worker_id, cfg.rpc_timeout_s, lambda: membership.epoch)
    worker = PrefillWorker(cfg, loop, sender, txn)
    server, port, health = await start_server(cfg.listen, [
        (prefill_pb2_grpc.add_PrefillServicer_to_server, PrefillServicer(worker), "pd.v1.Prefill")])

    def load() -> common_pb2.LoadReport:
        e = loop.engine
        return common_pb2.LoadReport(
            pending_prefill_tokens=loop.pending_prefill_tokens, active_decode_batch=0,
            free_blocks=e.num_free_blocks, reserved_blocks=0, total_blocks=e.blocks.num_blocks)

    membership = Membership(cfg.directory, cfg.worker_id, common_pb2.WORKER_ROLE_PREFILL,
                            advertised(cfg, port), "", loop.engine.abi.digest,
                            capacity(cfg, loop), load, rpc_timeout_s=cfg.rpc_timeout_s)
    await membership.start()
    log.info("prefill worker %s serving on %s", cfg.worker_id, advertised(cfg, port))

    async def on_stop():
        await membership.stop()
        await sender.close()
        loop.stop()

    await wait_for_shutdown(server, health, on_stop=on_stop)


def main() -> None:
    run_process(run)


if __name__ == "__main__":
    main()
