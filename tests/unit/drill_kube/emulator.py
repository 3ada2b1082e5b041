"""The chart's objects in kmock's Kubernetes emulator (an in-memory API server over HTTP),
served from a thread so that the synchronous `kubernetes` client can call it, with a
stand-in Deployment controller and a stand-in directory.

kmock stores what it is sent and serves it back; it runs no controller, ignores label
selectors, and answers a failed JSON-patch `test` with 500 where the API server says 422.
So this module plays the Deployment controller for the decode Deployment (on a template
change: bump the generation, then one step per read of the Deployment: observe, replace
one pod, replace the other), answers 422 there, and `FakeDirectory` plays the directory
the drill reads through Admin.Status (a new pod registers some listings after it started).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import threading

import jsonpatch
import kmock

from pdserve_ops.drill.cluster import Registered
from tests.support.helm import render

NS = "serving"
RELEASE = "pd"
DECODE = "pd-pdserve-decode"
CONFIG_MAP = "pd-pdserve-release"
DEP_UID = "uid-decode"
REVISION = "deployment.kubernetes.io/revision"
HASH = "pod-template-hash"
OLD_IMAGE = "ghcr.io/pdserve/pdserve:0.1.0-cuda"
NEW_IMAGE = "ghcr.io/pdserve/pdserve:0.2.0-cuda"
DEPLOYMENTS, REPLICASETS, PODS, CONFIGMAPS = "apps/v1/deployments", "apps/v1/replicasets", "v1/pods", "v1/configmaps"


@functools.cache
def _chart() -> dict[tuple[str, str], dict]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render()}


def chart() -> dict[tuple[str, str], dict]:
    """The chart's defaults rendered by the real helm (release pd, namespace serving), by
    (kind, name); a fresh copy."""
    return copy.deepcopy(_chart())


def _strings(resources: dict) -> dict:
    # The API server answers quantities as strings; helm renders `nvidia.com/gpu: 1` as a number.
    return {k: {q: str(v) for q, v in (vs or {}).items()} for k, vs in resources.items()}


def template(image: str) -> dict:
    """The decode pod template the chart renders, running `image`."""
    tpl = copy.deepcopy(chart()[("Deployment", DECODE)]["spec"]["template"])
    for c in tpl["spec"]["containers"] + tpl["spec"].get("initContainers", []):
        c["image"] = image
        c["resources"] = _strings(c.get("resources", {}))
    return tpl


def replica_set(pod_hash: str, revision: int, image: str, owner: str | None, **annotations: str) -> dict:
    tpl = template(image)
    tpl["metadata"]["labels"][HASH] = pod_hash
    selector = dict(chart()[("Deployment", DECODE)]["spec"]["selector"]["matchLabels"])
    owners = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": DECODE, "uid": owner, "controller": True}]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{DECODE}-{pod_hash}", "namespace": NS, "uid": f"uid-rs-{pod_hash}",
                         "labels": dict(tpl["metadata"]["labels"]),
                         "annotations": {REVISION: str(revision), **annotations},
                         "ownerReferences": owners if owner else []},
            "spec": {"replicas": 0, "selector": {"matchLabels": {**selector, HASH: pod_hash}}, "template": tpl}}


def pod(rs: dict, suffix: str, terminating: bool = False) -> dict:
    meta = rs["metadata"]
    out = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{meta['name']}-{suffix}", "namespace": NS, "uid": f"uid-pod-{suffix}",
                        "labels": dict(rs["spec"]["template"]["metadata"]["labels"]),
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": meta["name"],
                                             "uid": meta["uid"], "controller": True}]},
           "spec": copy.deepcopy(rs["spec"]["template"]["spec"]), "status": {"phase": "Running"}}
    if terminating:
        out["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return out


class FakeDirectory:
    """The workers Admin.Status lists: a started pod registers (epoch 1) `lag` listings later;
    `never` never registers."""

    def __init__(self, lag: int = 2, never: frozenset[str] = frozenset()):
        self.lag, self.never = lag, never
        self.listed: dict[str, Registered] = {}
        self.pending: dict[str, int] = {}
        self.listings = 0
        self._lock = threading.Lock()

    def start(self, worker_id: str) -> None:
        with self._lock:
            if worker_id not in self.never:
                self.pending[worker_id] = self.lag

    def stop(self, worker_id: str) -> None:
        with self._lock:
            self.listed.pop(worker_id, None)

    def list(self) -> list[Registered]:
        with self._lock:
            self.listings += 1
            for worker, left in list(self.pending.items()):
                if left <= 0:
                    self.listed[worker] = Registered(worker, 1, "decode")
                    del self.pending[worker]
                else:
                    self.pending[worker] = left - 1
            return list(self.listed.values())


class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the decode Deployment's controller (see the module docstring)."""

    def setup(self, directory: FakeDirectory, rs_owned_revisions: tuple[int, ...] = (1, 2)) -> None:
        """The release ConfigMap and decode Deployment as the chart renders them, at revision
        max(rs_owned_revisions): its ReplicaSets (rev 1 runs OLD_IMAGE, later ones NEW_IMAGE),
        two live pods of the newest, a terminating one of revision 1; a prefill ReplicaSet and
        an orphan with the decode labels that the drill must not take for history."""
        self.directory, self.steps = directory, 0
        rendered = chart()
        for res in (DEPLOYMENTS, REPLICASETS, PODS, CONFIGMAPS):
            self.resources[res] = {}
        cm = copy.deepcopy(rendered[("ConfigMap", CONFIG_MAP)])
        cm["metadata"]["namespace"] = NS
        self.objects[CONFIGMAPS, NS, CONFIG_MAP] = cm
        # The controller copies the Deployment's annotations onto each ReplicaSet it makes.
        sets = {rev: replica_set(f"h{rev}", rev, OLD_IMAGE if rev == 1 else NEW_IMAGE, DEP_UID,
                                 **{"kubernetes.io/change-cause": f"revision {rev}",
                                    "meta.helm.sh/release-name": RELEASE})
                for rev in rs_owned_revisions}
        newest = sets[max(sets)]
        newest["spec"]["replicas"] = 2
        dep = copy.deepcopy(rendered[("Deployment", DECODE)])
        dep["metadata"].update(namespace=NS, uid=DEP_UID, generation=3, resourceVersion="41",
                               annotations={REVISION: str(max(sets)), "meta.helm.sh/release-name": RELEASE})
        dep["spec"]["replicas"] = 2
        dep["spec"]["template"] = template(newest["spec"]["template"]["spec"]["containers"][0]["image"])
        dep["status"] = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2,
                         "readyReplicas": 2}
        self.objects[DEPLOYMENTS, NS, DECODE] = dep
        # Selectors can overlap: only the ReplicaSets the Deployment controls are its history.
        decoys = [replica_set("orphan", 9, NEW_IMAGE, None), replica_set("other", 7, OLD_IMAGE, "uid-other")]
        for rs in [*sets.values(), *decoys]:
            self.objects[REPLICASETS, NS, rs["metadata"]["name"]] = rs
        pods = [pod(newest, "a"), pod(newest, "b")] + ([pod(sets[1], "gone", terminating=True)] if 1 in sets else [])
        for p in pods:
            self.objects[PODS, NS, p["metadata"]["name"]] = p
            if "deletionTimestamp" not in p["metadata"]:
                directory.start(p["metadata"]["name"])
        for _ in range(directory.lag + 1):  # the old pods registered long ago
            directory.list()
        directory.listings = 0

    async def _render_error(self, exc: Exception):
        # The API server answers a JSON patch whose `test` fails with 422, kmock with 500.
        if isinstance(exc, jsonpatch.JsonPatchTestFailed):
            exc = kmock.KubernetesError(status=422, reason="Unprocessable Entity", message=str(exc))
        return await super()._render_error(exc)

    async def _handle(self, request):
        ours = request.resource == DEPLOYMENTS and request.name == DECODE
        if ours and request.method == "GET" and self.steps:
            self._controller_step()
        response = await super()._handle(request)
        if ours and request.method == "PATCH":  # the API server's part: a new spec, a new generation
            dep = self.objects[DEPLOYMENTS, NS, DECODE]
            dep.patch({"metadata": {"generation": dep["metadata"]["generation"] + 1,
                                    "resourceVersion": str(int(dep["metadata"]["resourceVersion"]) + 1)}})
            self.steps = 1
        return response

    def _controller_step(self) -> None:
        """One step of the roll-out (first read: not observed yet; then one pod a read)."""
        dep = self.objects[DEPLOYMENTS, NS, DECODE]
        target = self._matching_set(dep.raw["spec"]["template"])
        if target is None:  # no ReplicaSet holds this template: a new revision, never rolled out here
            return
        self.steps += 1
        if self.steps == 2:
            return
        rs_name = target["metadata"]["name"]
        old = [k for k, p in self.objects.items() if k[0] == PODS and not p.deleted
               and p["metadata"]["ownerReferences"][0]["name"] != rs_name]
        new = pod(target, f"n{self.steps - 2}")
        self.objects[PODS, NS, new["metadata"]["name"]] = new
        self.directory.start(new["metadata"]["name"])
        if old:
            if "deletionTimestamp" not in self.objects[old[0]]["metadata"]:
                self.directory.stop(old[0][2])
            self.objects[old[0]].delete()
        updated = self.steps - 2
        dep.patch({"status": {"observedGeneration": dep["metadata"]["generation"], "replicas": 2 + (updated < 2),
                              "updatedReplicas": updated, "availableReplicas": 2}})
        if updated == 1:  # the reused ReplicaSet becomes the newest revision
            revs = [int(rs["metadata"]["annotations"][REVISION]) for rs in self._owned()]
            self.objects[REPLICASETS, NS, rs_name].patch({"metadata": {"annotations": {REVISION: str(max(revs) + 1)}}})
        if updated >= 2:
            self.steps = 0

    def _owned(self) -> list:
        return [rs for k, rs in self.objects.items() if k[0] == REPLICASETS and not rs.deleted
                and any(o["uid"] == DEP_UID for o in rs["metadata"]["ownerReferences"])]

    def _matching_set(self, tpl: dict) -> dict | None:
        """The ReplicaSet whose template is `tpl` apart from the hash (the controller's rule)."""
        for rs in self._owned():
            theirs = copy.deepcopy(rs.raw["spec"]["template"])
            theirs["metadata"]["labels"].pop(HASH, None)
            if theirs == tpl:
                return rs.raw
        return None


class Running:
    """The emulator served on a loopback port from its own event loop thread."""

    def __init__(self, emulator: Emulator):
        self.emulator = emulator
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with self.emulator, kmock.Server(self.emulator) as server:
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Running:
        self._thread.start()
        assert self._ready.wait(10), "kmock did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        self._loop.close()
