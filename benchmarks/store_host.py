"""Host a TCPStore for a p10d or c10d benchmark round in its own process: ``python -m benchmarks.store_host``.

tensorplay and torch cannot share a process (their extensions register the same pybind types),
so the driver hosts neither: this process does, prints ``ready`` and keeps the store up until its
standard input closes (BRIEF fact 11: the host must outlive every handler).
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["tensorplay", "torch"], required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    if args.framework == "tensorplay":
        from tensorplay.distributed import TCPStore

        store = TCPStore("127.0.0.1", args.port, is_master=True, wait_for_workers=False, timeout=600)
    else:
        import torch.distributed

        store = torch.distributed.TCPStore(
            "127.0.0.1", args.port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600)
        )
    print("ready", flush=True)
    sys.stdin.read()
    del store


if __name__ == "__main__":
    main()
