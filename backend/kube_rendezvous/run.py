"""``python -m kube_rendezvous.run``: tensorplay's elastic launcher with backend ``k8s`` registered.

Takes exactly the arguments of ``python -m tensorplay.distributed.run``, e.g.::

    python -m kube_rendezvous.run --nnodes=2:4 --nproc-per-node=2 \\
        --rdzv-backend=k8s --rdzv-endpoint=team-a/llama-train train.py
"""

from __future__ import annotations

import logging
import os
import sys

from .handler import register


def main(argv: list[str] | None = None) -> None:
    """Register ``k8s`` and run tensorplay's launcher with ``argv`` (default: ``sys.argv[1:]``)."""
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    register()
    from tensorplay.distributed.run import main as launcher_main

    launcher_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
