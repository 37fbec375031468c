"""The TTL rule: delete a closed Rendezvous ``spec.ttlSecondsAfterClosed`` seconds after its last change.

A task per Rendezvous with a TTL (``lifecycle``); its decisions are ``ttl_rules``'s.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

from kube_rendezvous import RENDEZVOUS_PLURAL, KubernetesApi, KubernetesApiError, NotFoundError, resource_path

from . import ttl_rules
from .lifecycle import stopped_within
from .memory import OperatorMemo

logger = logging.getLogger(__name__)


async def delete_after_ttl(
    spec: dict[str, Any], namespace: str, name: str, uid: str, stopped: asyncio.Event, memo: OperatorMemo
) -> None:
    """Delete closed Rendezvous object ``uid`` ``spec.ttlSecondsAfterClosed`` seconds after its last change.

    The DELETE carries ``uid`` as a precondition: an object created anew under that name meanwhile is
    another run's, and is left alone.
    """
    ttl = int(spec["ttlSecondsAfterClosed"])
    path = resource_path(RENDEZVOUS_PLURAL, namespace, name)
    while not stopped.is_set():
        record = memo.get((namespace, name))
        observed = record.observed if record is not None else None
        status = observed.status if observed is not None else {}
        remaining = ttl_rules.ttl_remaining(status, ttl, datetime.now(timezone.utc))
        if remaining is None:
            await stopped_within(stopped, 2)
            continue
        if remaining > 0:
            await stopped_within(stopped, min(remaining, 5))
            continue
        try:
            await asyncio.to_thread(memo.api.request, "DELETE", path, body={"preconditions": {"uid": uid}})
        except NotFoundError:
            return
        except KubernetesApiError as exc:
            # A 409 (the precondition failed), or no answer (the outcome is unknown): read what is there now.
            if not await asyncio.to_thread(is_object, memo.api, path, uid):
                logger.info(
                    "closed Rendezvous %s/%s is gone or another object now: not deleted after its TTL", namespace, name
                )
                return
            logger.warning("could not delete closed Rendezvous %s/%s after its TTL: %s", namespace, name, exc)
            await stopped_within(stopped, 5)
            continue
        logger.info("deleted closed Rendezvous %s/%s after its TTL of %d s", namespace, name, ttl)
        return


def is_object(client: KubernetesApi, path: str, uid: str) -> bool:
    """Whether the object at ``path`` is object ``uid`` (also when it cannot be read: then it may be)."""
    try:
        found = client.request("GET", path)
    except NotFoundError:
        return False
    except KubernetesApiError:
        return True
    return bool(found["metadata"].get("uid") == uid)
