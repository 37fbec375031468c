"""What the library knows of tensorplay 1.0.0 (``kube-rendezvous[tensorplay]``): its ``Framework``.

tensorplay is imported when its ``Framework`` is first asked for, not when this module is: a torch process
may import the public ``create_backend`` (``backend``) and pass torch's ``Framework``
(``torchrun.torch_framework()``).
"""

from __future__ import annotations

import functools
from typing import Any

from .._engine.frameworks import Framework
from .elastic import elastic_framework


@functools.cache
def tensorplay_framework() -> Framework:
    """tensorplay 1.0.0's elastic package, as the engine sees it."""
    from tensorplay.distributed import TCPStore  # type: ignore[attr-defined]
    from tensorplay.distributed._store import StoreTimeoutError

    def server(addr: str) -> Any:
        return TCPStore(addr, 0, world_size=1, is_master=True, wait_for_workers=False)

    return elastic_framework(
        "tensorplay",
        store_timeout_error=StoreTimeoutError,
        round_prefix="tp_elastic/rendezvous/{run_id}/{round}",
        written_once=("tp_elastic/rdzv/master_", "tp_elastic/role_info/", "tp_elastic/assigned_ranks/"),
        create_store_server=server,
    )


__all__ = ["tensorplay_framework"]
