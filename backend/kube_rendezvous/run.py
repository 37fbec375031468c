"""``python -m kube_rendezvous.run``: tensorplay's elastic launcher with backend ``k8s`` registered.

Takes exactly the arguments of ``python -m tensorplay.distributed.run``, e.g.::

    python -m kube_rendezvous.run --nnodes=2:4 --nproc-per-node=2 \\
        --rdzv-backend=k8s --rdzv-endpoint=team-a/llama-train train.py

The public path of the launcher, which lives with tensorplay's adapter (``_adapters.launcher``: tensorplay's
``launch_agent``, with the agent wrapped so that it tells its ``k8s`` handler when its workers succeeded).
"""

from __future__ import annotations

from ._adapters.launcher import launch_agent, main

__all__ = ["launch_agent", "main"]

if __name__ == "__main__":
    main()
