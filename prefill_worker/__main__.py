"""`python -m prefill_worker`: a prefill worker process."""

from __future__ import annotations

import logging

from services.common.grpc_server import setup_logging, start_server, wait_for_shutdown
from services.directory.client import DirectoryClient
from services.directory.records import LoadReport, WorkerInfo, WorkerRole
from services.rpc.pd.v1 import prefill_pb2_grpc
from services.worker.directory_ops import TxnOps
from services.worker.membership import Membership
from services.worker.process import (
    advertised,
    block_counts,
    build_engine_loop,
    build_sender,
    capacity,
    metrics_file,
    parse_config,
    run_process,
)
from services.worker.profile import ProfileConfig, obtain

from .server import PrefillServicer
from .worker import PrefillWorker

log = logging.getLogger("prefill_worker")


async def run(argv: list[str] | None = None) -> None:
    cfg, log_level = parse_config("prefill", argv)
    setup_logging(cfg.worker_id, log_level)
    loop, check = build_engine_loop(cfg)
    loop.start()
    profile_cfg = ProfileConfig.from_env()
    profile = await loop.call(lambda e: obtain(e, profile_cfg))  # before serving: nothing else runs yet
    sender = build_sender(cfg)
    await sender.start()
    directory = DirectoryClient(cfg.directory_addr, cfg.rpc_timeout_s)
    membership: Membership | None = None
    txn = TxnOps(directory, cfg.worker_id, lambda: membership.epoch)
    worker = PrefillWorker(cfg, loop, sender, txn)
    server, port, health = await start_server(cfg.listen, [
        (prefill_pb2_grpc.add_PrefillServicer_to_server, PrefillServicer(worker), "pd.v1.Prefill")])

    def load() -> LoadReport:
        return LoadReport(pending_prefill_tokens=loop.pending_prefill_tokens, **block_counts(loop.engine))

    membership = Membership(
        directory, WorkerInfo(cfg.worker_id, WorkerRole.PREFILL, advertised(cfg, port), "",
                              loop.engine.abi.digest, capacity(cfg, loop), profile, check.reason),
        load)
    await membership.start()
    metrics = metrics_file(cfg, loop, sender)
    metrics.start()
    log.info("prefill worker %s serving on %s", cfg.worker_id, advertised(cfg, port))

    async def on_stop():
        await metrics.stop()
        await membership.stop()
        await sender.close()
        await directory.close()
        loop.stop()

    await wait_for_shutdown(server, health, on_stop=on_stop)


def main() -> None:
    run_process(run)


if __name__ == "__main__":
    main()
