"""Transfer benchmark: pdserve K/V hand-off vs native UCX, a gRPC stream and a raw socket.

Part 1, per cache size (1, 16, 64, 256 MiB), in one run, sender and receiver in
two spawned processes (bench/_transfer_peers.py on bench/_spawned.py):

  pdserve-ucx   runtime.transfer `ucx` backend: chunks planned like the prefill
                worker (plan_chunks: layer-major, <= max_chunk_blocks blocks),
                each checksummed, then all sent in one `send_many` from views of
                the sender's cache (chunks up to 256 KiB packed into one message
                per 2 MiB), received into views of the receiver's cache, then
                commit; timed from the first checksum to the verdict
  pdserve-tcp   the same over the `tcp` backend
  ucxx-python   the floor of a UCX hand-off from Python: the whole cache as one
                tagged message through the same ucxx runtime and endpoint kind as
                pdserve-ucx (worker address, shared memory), into one receive
                posted beforehand, and a 1-byte ack sent back from the receiver's
                event loop; timed from the post to the ack. No header, no chunks,
                no checksum: what any Python UCX protocol pays at least
  ucxx-python-pieces  the same, but the cache as the pieces pdserve-ucx sends
                (each chunk's K run and V run, plan order: the engine's [L, 2, N, ...]
                layout keeps them apart), every receive posted beforehand: the floor
                of moving this geometry's messages from Python
  ucxx-python-exact  the floor of an exact hand-off of this geometry from Python:
                pdserve's checksums on both sides and its packing (one copy each
                side for small chunks), every receive posted beforehand, no
                protocol (bench/_transfer_exact.py)
  ucxx-python-commit  the exact floor with a COMMIT instead of the bare checksums: the
                manifest as pdserve encodes it (JSON rows), decoded on the receiver and
                checked against what landed before the ack. The floor of a hand-off whose
                receiver knows the plan beforehand (posts its receives ahead, no header)
                and whose only control message is the COMMIT
  ucx_perftest  native `ucx_perftest -t tag_bw`, UCX_TLS=shm,self, one message =
                the cache size, default window (32 in flight), -n/-w iterations
  grpc-stream   grpcio client stream of `bytes` messages (--grpc-message-mib)
                into the receiver's cache; timed from the call to its response
  raw-tcp       loopback socket: sendall of the cache, recv_into the receiver's
                cache, one-byte ack; timed from the first byte to the ack

Every timed transfer except ucx_perftest's lands in a receiver cache zeroed
beforehand and must match the sender's digest (xxh3-128 of the whole cache),
or no figure is reported for that path. The first transfer of each size and
path is a warm-up (connection setup, page faults) and is not timed; the figure
is the median of --repeats (at least SMALL_REPEATS up to SMALL_MIB). The paths take turns,
round by round: a noisy host's slow spell lands on all of them alike. gbps is 1e9
bytes/s. One JSON line per size and path:
{"bench": "transfer", "size_mib", "path", "gbps", "ratio_vs_native", "ratio_vs_grpc"},
ratios = this path's gbps over ucx_perftest's / grpc-stream's at the same size,
measured in this run (pdserve rows add time_vs_raw_tcp). Each row but ucx_perftest's has
cpu_ms_sender / cpu_ms_receiver: the median CPU a transfer cost each peer process, the
bench's own work per transfer included (zeroing and digesting the receiver's cache, the
commands), alike for every path: compare paths, not the figure with the time
(bench/_transfer_cpu.py). Then one {"metric": "target", ...} line per target
(docs/benchmarks.md, Transfer) part 1 can judge (1 MiB vs raw TCP, 64 MiB vs native); the
1 MiB one says how much more time and CPU (each side) pdserve-ucx took than the exact floor.

--timeline-transfers (default 20): after the timed rounds of the first size, that many
more pdserve-ucx hand-offs with per-step stamps in both peers, one
{"metric": "timeline", "who", "step", "start_us", "wall_us", "cpu_us"} row per step and a
"timeline_summary" (bench/_transfer_timeline.py).

Part 2 (--streaming, default on): bench/_transfer_exposed.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _spawned import Spawned
from _transfer_cpu import cpu_medians, over_exact_floor, with_cpu
from _transfer_peers import Geometry
from _transfer_perftest import find_perftest, run_tag_bw
from _transfer_timeline import run_timeline

from runtime.transfer.keys import new_key
from tooling.cluster.ports import free_port

MIB = 1 << 20
PATHS = ("pdserve-ucx", "pdserve-tcp", "ucxx-python", "ucxx-python-pieces", "ucxx-python-exact", "ucxx-python-commit",
         "ucx_perftest", "grpc-stream", "raw-tcp")
CALL_TIMEOUT_S = 600


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def geometry(size_bytes: int, layers: int, block_bytes: int, max_chunk_blocks: int) -> Geometry:
    """The synthetic cache of exactly `size_bytes` (or a ValueError)."""
    per_block_all_layers = layers * block_bytes
    if size_bytes % per_block_all_layers:
        raise ValueError(f"{size_bytes} bytes is not a whole number of {layers} layers x "
                         f"{block_bytes}-byte blocks")
    return Geometry(layers, size_bytes // per_block_all_layers, block_bytes, max_chunk_blocks)


def interleaved(ones: dict[str, object], repeats: int, errors: dict[str, str]) -> dict[str, list[float]]:
    """Each path's `one(i)` -> seconds, round by round (every path's transfer i, then every
    path's i + 1): a warm-up round (i = 0, dropped), then `repeats` timed ones. A noisy host's
    slow spell then lands on every path alike, not on whichever path ran through it. A path
    that raises is dropped, its error kept in `errors`."""
    runs: dict[str, list[float]] = {path: [] for path in ones}
    for i in range(repeats + 1):
        for path, one in ones.items():
            if path in errors:
                continue
            try:
                t = one(i)
            except Exception as e:  # noqa: BLE001 - one path failing must not hide the others
                errors[path] = f"{type(e).__name__}: {e}"
                continue
            if i:
                runs[path].append(t)
    return {path: t for path, t in runs.items() if path not in errors}


def check_digest(got: str, want: str, path: str) -> None:
    if got != want:
        raise RuntimeError(f"{path}: receiver digest {got} != sent {want} (wrong bytes moved)")


def pdserve_path(r: Spawned, s: Spawned, kind: str, dest: str, sent: str, size_mib: int):
    def one(i: int) -> float:
        tid, key = f"{kind}-{size_mib}-{i}", new_key().hex()  # the router's part: a secret per attempt
        r.call("pd_expect", kind=kind, transfer_id=tid, key=key)
        out = s.call("pd_send", kind=kind, dest=dest, transfer_id=tid, kv_digest=sent, key=key)
        res = r.call("pd_result", kind=kind, transfer_id=tid)
        if not out["published"] or res["state"] != "published":
            raise RuntimeError(f"pdserve-{kind}: not published ({out['reason']} / {res['reason']})")
        check_digest(res["digest"], sent, f"pdserve-{kind}")
        return out["elapsed_s"]
    return one


def floor_path(r: Spawned, s: Spawned, sent: str, pieces: bool):
    sender = s.call("floor_address")
    dest = r.call("floor_address")
    name = "ucxx-python-pieces" if pieces else "ucxx-python"

    def one(i: int) -> float:
        r.call("floor_expect", i=i, sender=sender, pieces=pieces)
        out = s.call("floor_send", dest=dest, i=i, pieces=pieces)
        check_digest(r.call("floor_landed", i=i), sent, name)
        return out["elapsed_s"]
    return one


def exact_path(r: Spawned, s: Spawned, sent: str, commit: bool = False):
    sender, dest = s.call("floor_address"), r.call("floor_address")

    def one(i: int) -> float:
        r.call("exact_expect", i=i, sender=sender, commit=commit)
        out = s.call("exact_send", dest=dest, i=i, commit=commit)
        check_digest(r.call("exact_landed", i=i), sent, "ucxx-python-commit" if commit else "ucxx-python-exact")
        return out["elapsed_s"]
    return one


def grpc_path(r: Spawned, s: Spawned, port: int, sent: str, size_bytes: int, message_bytes: int):
    def one(i: int) -> float:
        r.call("zero")
        out = s.call("grpc_send", port=port, message_bytes=message_bytes)
        assert out["received_bytes"] == size_bytes, out
        check_digest(r.call("digest"), sent, "grpc-stream")
        return out["elapsed_s"]
    return one


def raw_path(r: Spawned, s: Spawned, port: int, sent: str):
    def one(i: int) -> float:
        r.call("zero")
        out = s.call("raw_send", port=port)
        check_digest(r.call("digest"), sent, "raw-tcp")
        return out["elapsed_s"]
    return one


SMALL_MIB, SMALL_REPEATS = 4, 31
"""Sizes up to SMALL_MIB take at least SMALL_REPEATS rounds: a round costs milliseconds there,
and a median of 5 on a noisy host moved the 1 MiB ratio by half (its ms spread 1.3-2.1)."""


def repeats_at(size_mib: int, repeats: int) -> int:
    return max(repeats, SMALL_REPEATS) if size_mib <= SMALL_MIB else repeats


def perftest_iters(size_bytes: int, total_mib: int) -> tuple[int, int]:
    """(iterations, warm-up) moving about `total_mib` per run, at least 8 messages."""
    iters = max(8, total_mib * MIB // size_bytes)
    return iters, max(2, iters // 10)


def ucx_backend_available() -> str:
    """'' when the `ucx` backend is registered, else why not."""
    from runtime.transfer import factory
    if "ucx" in factory.SENDERS and "ucx" in factory.RECEIVERS:
        return ""
    return "backend 'ucx' not registered in runtime.transfer.factory yet"


def transfer_part(args) -> dict[int, dict[str, float]]:
    """Run part 1; returns {size_mib: {path: gbps}}."""
    sizes = [int(x) for x in args.sizes_mib.split(",")]
    paths = [p for p in args.paths.split(",") if p]
    unknown = set(paths) - set(PATHS)
    if unknown:
        raise SystemExit(f"unknown paths {sorted(unknown)}; known {PATHS}")
    skip: dict[str, str] = {}
    if "pdserve-ucx" in paths and (why := ucx_backend_available()):
        skip["pdserve-ucx"] = why
        skip["ucxx-python"] = skip["ucxx-python-pieces"] = why
    if "ucx_perftest" in paths:
        try:
            find_perftest()
        except (ImportError, FileNotFoundError) as e:
            skip["ucx_perftest"] = str(e)
    for p, why in skip.items():
        emit(bench="transfer", path=p, skipped=why)

    table: dict[int, dict[str, float]] = {}
    cpus: dict[int, dict[str, tuple[float, float]]] = {}  # size -> path -> (sender, receiver) CPU s
    r, s = (Spawned(name, "_transfer_peers:Peer", call_timeout_s=CALL_TIMEOUT_S, threads=args.threads)
            for name in ("receiver", "sender"))
    try:
        dests = {kind: r.call("pd_listen", kind=kind) for kind in ("ucx", "tcp")
                 if f"pdserve-{kind}" in paths and f"pdserve-{kind}" not in skip}
        grpc_port = r.call("grpc_listen") if "grpc-stream" in paths else 0
        raw_port = r.call("raw_listen") if "raw-tcp" in paths else 0
        for size_mib in sizes:
            size_bytes = size_mib * MIB
            g = geometry(size_bytes, args.layers, args.block_kib * 1024, args.max_chunk_blocks)
            r.call("alloc", geometry=g.__dict__)
            sent = s.call("alloc", geometry=g.__dict__, fill_seed=size_mib)
            errors: dict[str, str] = {}
            ones = {}

            def attempt(path: str, make) -> None:
                if path not in paths or path in skip:
                    return
                try:
                    ones[path] = make()
                except Exception as e:  # noqa: BLE001 - one path failing must not hide the others
                    errors[path] = f"{type(e).__name__}: {e}"

            for kind, dest in dests.items():
                attempt(f"pdserve-{kind}", lambda: pdserve_path(r, s, kind, dest, sent, size_mib))
            attempt("ucxx-python", lambda: floor_path(r, s, sent, pieces=False))
            attempt("ucxx-python-pieces", lambda: floor_path(r, s, sent, pieces=True))
            attempt("ucxx-python-exact", lambda: exact_path(r, s, sent))
            attempt("ucxx-python-commit", lambda: exact_path(r, s, sent, commit=True))
            attempt("grpc-stream", lambda: grpc_path(r, s, grpc_port, sent, size_bytes, args.grpc_message_mib * MIB))
            attempt("raw-tcp", lambda: raw_path(r, s, raw_port, sent))
            cpu: dict[str, list[tuple[float, float]]] = {p: [] for p in ones}
            runs = interleaved({p: with_cpu(one, r, s, cpu[p]) for p, one in ones.items()},
                               repeats_at(size_mib, args.repeats), errors)
            if size_mib == sizes[0] and args.timeline_transfers and "pdserve-ucx" in runs:
                try:
                    for row in run_timeline(r, s, ones["pdserve-ucx"], args.timeline_transfers, size_mib):
                        emit(**row)
                except Exception as e:  # noqa: BLE001 - the instrument failing must not hide the figures
                    emit(bench="transfer", metric="timeline", size_mib=size_mib, error=f"{type(e).__name__}: {e}")
            iters, warm = perftest_iters(size_bytes, args.perftest_total_mib)
            native_extra = {}
            if "ucx_perftest" in paths and "ucx_perftest" not in skip:
                try:
                    out = run_tag_bw(size_bytes, iters, warm, free_port(), args.perftest_tls)
                    native_extra.update(iterations=iters, warmup=warm)
                    runs["ucx_perftest"] = [size_bytes / out["gbps"] / 1e9]
                except Exception as e:  # noqa: BLE001 - one path failing must not hide the others
                    errors["ucx_perftest"] = f"{type(e).__name__}: {e}"
            table[size_mib] = report(size_mib, size_bytes, g, runs, errors, native_extra, cpu)
            cpus[size_mib] = {p: cpu_medians(c) for p, c in cpu.items() if c}
    finally:
        r.close()
        s.close()
    targets(table, cpus)
    return table


def targets(table: dict[int, dict[str, float]], cpus: dict[int, dict[str, tuple[float, float]]] | None = None
            ) -> None:
    """The part-1 targets (docs/benchmarks.md, Transfer), each from figures of this run (where
    measured), with the ucxx-python floors beside them: where a floor itself misses a target,
    the limit is Python + ucxx on this machine (the exact floor: plus checking every byte), not
    pdserve's protocol (limit_* fields)."""
    small, large = table.get(1, {}), table.get(64, {})
    if "pdserve-ucx" in small and "raw-tcp" in small:
        ratio = small["raw-tcp"] / small["pdserve-ucx"]
        row = dict(time_vs_raw_tcp=round(ratio, 2), met=ratio <= 2.0)
        if "ucxx-python" in small:
            row.update(limit_floor_time_vs_raw_tcp=round(small["raw-tcp"] / small["ucxx-python"], 2),
                       time_vs_floor=round(small["ucxx-python"] / small["pdserve-ucx"], 2))
        if "ucxx-python-exact" in small:  # what checking every byte costs from Python, at least
            row.update(limit_exact_floor_time_vs_raw_tcp=round(small["raw-tcp"] / small["ucxx-python-exact"], 2),
                       time_vs_exact_floor=round(small["ucxx-python-exact"] / small["pdserve-ucx"], 2))
            row.update(over_exact_floor(small, (cpus or {}).get(1, {})))
        if "ucxx-python-commit" in small:  # the same with a COMMIT's manifest decoded and checked
            row.update(limit_commit_floor_time_vs_raw_tcp=round(small["raw-tcp"] / small["ucxx-python-commit"], 2),
                       time_vs_commit_floor=round(small["ucxx-python-commit"] / small["pdserve-ucx"], 2))
        emit(bench="transfer", metric="target", target="1 MiB hand-off <= 2x raw TCP time", size_mib=1, **row)
    if "pdserve-ucx" in large and "ucx_perftest" in large:
        ratio = large["pdserve-ucx"] / large["ucx_perftest"]
        row = dict(ratio_vs_native=round(ratio, 3), met=ratio >= 0.7)
        if "ucxx-python" in large:
            row.update(limit_floor_ratio_vs_native=round(large["ucxx-python"] / large["ucx_perftest"], 3),
                       ratio_vs_floor=round(ratio * large["ucx_perftest"] / large["ucxx-python"], 3))
        if "ucxx-python-exact" in large:
            row.update(limit_exact_floor_ratio_vs_native=round(large["ucxx-python-exact"] / large["ucx_perftest"], 3))
        if "ucxx-python-pieces" in large:
            row.update(limit_pieces_floor_ratio_vs_native=round(large["ucxx-python-pieces"] / large["ucx_perftest"], 3))
        emit(bench="transfer", metric="target", target="64 MiB >= 0.7x native ucx_perftest", size_mib=64, **row)


def report(size_mib: int, size_bytes: int, g: Geometry, runs: dict[str, list[float]],
           errors: dict[str, str], native_extra: dict,
           cpu: dict[str, list[tuple[float, float]]] | None = None) -> dict[str, float]:
    gbps = {p: size_bytes / statistics.median(t) / 1e9 for p, t in runs.items()}
    native, grpc, raw = gbps.get("ucx_perftest"), gbps.get("grpc-stream"), gbps.get("raw-tcp")
    for path in PATHS:
        if path in errors:
            emit(bench="transfer", size_mib=size_mib, path=path, error=errors[path])
        if path not in gbps:
            continue
        row = dict(bench="transfer", size_mib=size_mib, path=path, gbps=round(gbps[path], 3),
                   ratio_vs_native=round(gbps[path] / native, 3) if native else None,
                   ratio_vs_grpc=round(gbps[path] / grpc, 3) if grpc else None)
        if path == "ucx_perftest":
            row.update(native_extra)
        else:
            row.update(ms=[round(t * 1000, 2) for t in runs[path]])
        if cpu and cpu.get(path):  # (with the bench's own work per transfer: compare paths)
            sender, receiver = cpu_medians(cpu[path])
            row.update(cpu_ms_sender=round(sender * 1000, 3), cpu_ms_receiver=round(receiver * 1000, 3))
        if path.startswith(("pdserve", "ucxx-python")):
            row.update(time_vs_raw_tcp=round(raw / gbps[path], 2) if raw else None)
        if path.startswith("pdserve"):
            row.update(chunks=len(g.plan()))
        emit(**row)
    return gbps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,16,64,256")
    ap.add_argument("--repeats", type=int, default=5, help="timed transfers per size and path")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--layers", type=int, default=32, help="synthetic cache layers")
    ap.add_argument("--block-kib", type=int, default=32, help="K+V bytes of one block per layer")
    ap.add_argument("--max-chunk-blocks", type=int, default=64,
                    help="blocks per chunk (WorkerConfig.max_chunk_blocks default)")
    ap.add_argument("--grpc-message-mib", type=int, default=1)
    ap.add_argument("--perftest-tls", default="shm,self")
    ap.add_argument("--perftest-total-mib", type=int, default=2048,
                    help="bytes one ucx_perftest run moves (iterations = this / size, >= 8)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads in each peer")
    ap.add_argument("--timeline-transfers", type=int, default=20,
                    help="pdserve-ucx hand-offs of the first size with per-step stamps in both "
                         "peers, after the timed rounds (bench/_transfer_timeline.py); 0: none")
    ap.add_argument("--streaming", action=argparse.BooleanOptionalAction, default=True,
                    help="also run part 2 (exposed transfer on a local cluster)")
    ap.add_argument("--transfer", action=argparse.BooleanOptionalAction, default=True,
                    help="run part 1 (bandwidth per path)")
    from _transfer_exposed import add_arguments
    add_arguments(ap)
    args = ap.parse_args()
    emit(bench="transfer", metric="config", units="gbps = 1e9 bytes/s; size_mib = 2^20 bytes",
         sizes_mib=args.sizes_mib, repeats=args.repeats, paths=args.paths,
         timing=f"median of repeats (at least {SMALL_REPEATS} up to {SMALL_MIB} MiB) after one untimed warm-up, "
                "the paths interleaved round by round; pdserve: first checksum -> verdict",
         geometry=f"{args.layers} layers x {args.block_kib} KiB (K+V) blocks, "
                  f"<= {args.max_chunk_blocks} blocks/chunk, layer-major",
         grpc_message_mib=args.grpc_message_mib,
         perftest=f"tag_bw, UCX_TLS={args.perftest_tls}, message = cache size, default window, "
                  f"~{args.perftest_total_mib} MiB per run",
         ucx_env={k: v for k, v in os.environ.items() if k.startswith("UCX_")},
         peer_torch_threads=args.threads, cpus=os.cpu_count())
    bandwidth = transfer_part(args) if args.transfer else {}
    if args.streaming:
        from _transfer_exposed import exposed_part
        exposed_part(args, emit, bandwidth)


if __name__ == "__main__":
    main()
