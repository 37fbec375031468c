"""Our launcher, ``python -m kube_rendezvous.run`` (its public path): tensorplay's elastic launcher with backend
``k8s`` registered. It lives in the adapters, since it is tensorplay's own code wrapped.

Takes exactly the arguments of ``python -m tensorplay.distributed.run``, e.g.::

    python -m kube_rendezvous.run --nnodes=2:4 --nproc-per-node=2 \\
        --rdzv-backend=k8s --rdzv-endpoint=team-a/llama-train train.py

It is tensorplay's ``launch_agent``, with the agent wrapped (``SuccessReportingAgent``) so that it
tells its ``k8s`` handler when its workers succeeded: the handler's ``shutdown`` then closes the
rendezvous, and leaves it on every other exit (a failure, a SIGTERM). The handler also learns
success when the agent enters its exit barrier, but tensorplay's agent skips that barrier in a
world of one node. (Stock torchrun is not wrapped: torch's agent always enters its barrier.)
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

from .._engine.native import NativeHandler
from .handler import register


def launch_agent(config: Any, entrypoint: Callable[..., Any] | str | None, args: list[Any]) -> Any:
    """Run one node's agent to completion, as tensorplay's ``launch_agent``, with ``SuccessReportingAgent``.

    Raises:
        ChildFailedError: a worker failed after the restarts ran out.
    """
    from tensorplay.distributed.elastic.agent.server.api import WorkerSpec, WorkerState
    from tensorplay.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from tensorplay.distributed.elastic.multiprocessing.errors import ChildFailedError, record
    from tensorplay.distributed.launcher.api import _make_rdzv_handler

    class SuccessReportingAgent(LocalElasticAgent):
        """tensorplay's agent, telling a ``k8s`` handler that its workers succeeded before it shuts the handler down."""

        def _invoke_run(self, role: str = "default") -> Any:
            result = super()._invoke_run(role)
            handler = self.get_worker_group(role).spec.rdzv_handler
            if result.state == WorkerState.SUCCEEDED and isinstance(handler, NativeHandler):
                handler.succeeded = True
            return result

    @record
    def launch() -> Any:
        handler = _make_rdzv_handler(config)  # tensorplay's own: the launcher's --rdzv-* flags as parameters
        spec = WorkerSpec(
            role=config.role,
            local_world_size=config.nproc_per_node,
            rdzv_handler=handler,
            entrypoint=entrypoint,
            args=tuple(args),
            max_restarts=config.max_restarts,
            monitor_interval=config.monitor_interval,
            master_addr=config.master_addr,
            master_port=config.master_port,
            local_addr=config.local_addr,
            logs_specs=None,
            start_method=config.start_method,
            redirects=config.redirects,
            tee=config.tee,
            log_dir=config.log_dir,
        )
        agent = SuccessReportingAgent(spec=spec, log_dir=config.log_dir)
        try:
            result = agent.run()
        except ChildFailedError:
            raise
        except Exception:
            try:
                handler.shutdown()  # the first shutdown decides: a handler shut down already is not changed
            except Exception as exc:  # noqa: BLE001 - the original error is what the user must see
                logging.getLogger(__name__).info("shutting the rendezvous handler down failed: %s", exc)
            raise
        if result.is_failed():
            raise ChildFailedError([(config.role, failure) for failure in result.failures.values()])
        return result.return_values

    return launch()


def main(argv: list[str] | None = None) -> None:
    """Register ``k8s`` and run tensorplay's launcher with ``argv`` (default: ``sys.argv[1:]``)."""
    logging.basicConfig(
        level=os.environ.get("LOGLEVEL", "WARNING").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    register()
    from tensorplay.distributed.run import config_from_args, main_args

    args = main_args(sys.argv[1:] if argv is None else argv)
    with warnings.catch_warnings(record=True) as caught:
        config, entrypoint, entry_args = config_from_args(args)
    for warning in caught:
        warnings.warn(warning.message, warning.category, stacklevel=2)
    if not args.run_path and not args.module and not os.path.isfile(args.training_script):
        raise SystemExit(f"{args.training_script} is not a valid file path")
    launch_agent(config, entrypoint, entry_args)
