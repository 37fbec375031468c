"""One flood-tenant process of the busy-server benchmark (``benchmarks/busy_server.py``): another tenant's
ServiceAccount sending LISTs and writes of its own ConfigMaps as fast as the API server answers.

``--threads`` threads, each a loop: a LIST of the namespace's ConfigMaps, then a merge patch of one of them,
and again. Every request is recorded as ``[start (time.time()), seconds, status, verb]``, status 0 for no
answer. A 429 is waited out as its ``Retry-After`` says (as client-go's clients do), then the thread goes on.
Prints ``ready`` once its connection pool exists, floods from ``go`` until stdin says ``stop`` (or closes),
then writes ``{"requests": [...], "levels": [the X-Kubernetes-PF-PriorityLevel-UID values seen]}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

import urllib3

from benchmarks.round_worker import write_json

#: The response header in which API Priority and Fairness names the priority level that handled a request.
LEVEL_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"
#: The longest a thread waits out one 429's ``Retry-After`` (seconds).
LONGEST_RETRY_AFTER = 5.0


def credentials(kubeconfig: str) -> tuple[str, str, str]:
    """(server, CA file, bearer token) of a token kubeconfig (``ControlPlane.serviceaccount_kubeconfig``'s JSON)."""
    with open(kubeconfig) as handle:
        config = json.load(handle)
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    return cluster["server"], cluster["certificate-authority"], user["token"]


def retry_after(response: urllib3.BaseHTTPResponse) -> float:
    """The seconds of a 429's ``Retry-After`` (delta-seconds; 1 if absent or not a number), at most the longest."""
    try:
        return min(LONGEST_RETRY_AFTER, float(response.headers.get("Retry-After", "1")))
    except ValueError:
        return 1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--objects", type=int, required=True, help="ConfigMaps flood-0 .. flood-(objects-1) exist")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--worker", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    from benchmarks.run import lower_priority

    lower_priority()  # a tenant's client runs on machines of its own; here it must not starve the server
    server, ca_file, token = credentials(args.kubeconfig)
    pool = urllib3.PoolManager(maxsize=args.threads, ca_certs=ca_file, timeout=urllib3.Timeout(connect=10, read=70))
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    patch_headers = {**headers, "Content-Type": "application/merge-patch+json"}
    base = f"{server}/api/v1/namespaces/{args.namespace}/configmaps"
    stop = threading.Event()
    records: list[list[Any]] = []
    levels: set[str] = set()

    def send(method: str, url: str, verb: str, body: bytes | None = None) -> None:
        began, wall = time.perf_counter(), time.time()
        try:
            response = pool.request(
                method, url, body=body, headers=patch_headers if body else headers, retries=False, preload_content=True
            )
            status = response.status
        except Exception:  # noqa: BLE001 - no answer: recorded as status 0
            records.append([wall, time.perf_counter() - began, 0, verb])
            return
        records.append([wall, time.perf_counter() - began, status, verb])  # list.append: atomic under the GIL
        level = response.headers.get(LEVEL_HEADER)
        if level is not None and level not in levels:
            levels.add(level)
        if status == 429:
            stop.wait(retry_after(response))

    def flood(index: int) -> None:
        count = 0
        while not stop.is_set():
            send("GET", base, "list")
            name = f"flood-{(index * 7919 + count) % args.objects}"
            body = json.dumps({"data": {"n": str(count)}}).encode()
            send("PATCH", f"{base}/{name}", "write", body)
            count += 1

    threads = [threading.Thread(target=flood, args=(index,), daemon=True) for index in range(args.threads)]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    for thread in threads:
        thread.start()
    sys.stdin.readline()  # "stop", or the driver closed the pipe
    stop.set()
    for thread in threads:
        thread.join(75)
    write_json(args.out, {"requests": records, "levels": sorted(levels)})


if __name__ == "__main__":
    main()
