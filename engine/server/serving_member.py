"""The member users create: ``Member(...)``, embedded, serving clients, or part of a cluster.

``Member()`` and ``Member(data_dir)`` run jobs in the calling process, exactly as the engine's
member does. ``port=`` also serves clients (a :class:`Client`, the CLI) on that port (0: a free
one; :attr:`address` says which). ``cluster=`` makes it a member of a cluster (see
:class:`~jetwake.engine.cluster.cluster_member.ClusterMember`)::

    Member(data_dir="d1", cluster="prod", kafka_bootstrap_servers="kafka:9092", port=0,
           token="s3cret")
"""

from __future__ import annotations

import os
from typing import Any

from jetwake.engine.cluster.cluster_member import ClusterMember
from jetwake.engine.server.member_service import MemberService

__all__ = ["Member"]


class Member(ClusterMember):
    """A member: see the module doc. ``host`` is where it listens for clients and peers
    (loopback by default; any other address needs a ``token``)."""

    def __init__(self, data_dir: str | os.PathLike | None = None, *,
                 cluster: str | None = None, kafka_bootstrap_servers: str | None = None,
                 port: int | None = None, host: str = "127.0.0.1", token: str | None = None,
                 advertise: str | None = None, peer_port: int = 0,
                 **options: Any) -> None:
        if port is not None and (type(port) is not int or not 0 <= port <= 65535):
            raise ValueError(f"port must be an int in [0, 65535] (0: a free port), got {port!r}")
        self.service: MemberService | None = None
        super().__init__(data_dir, cluster=cluster, kafka_bootstrap_servers=kafka_bootstrap_servers,
                         token=token, peer_host=host, peer_port=peer_port,
                         advertise=_peer_advertise(advertise), **options)
        if port is None:
            return
        try:
            self.service = MemberService(self, host, port, token).start()
        except BaseException:
            self.shutdown(graceful=False)
            raise
        self.client_address = advertise or self.service.address_text

    @property
    def address(self) -> str | None:
        """Where clients reach this member (``host:port``); None when it serves none."""
        return self.client_address

    def shutdown(self, graceful: bool | None = None) -> None:
        service = self.service
        if service is not None and service.serving:
            service.stop()  # no new requests while the jobs stop
        super().shutdown(graceful)


def _peer_advertise(advertise: str | None) -> str | None:
    """Peers reach a member advertised as ``HOST:PORT`` on HOST (at its own peer port)."""
    if advertise is None:
        return None
    if not isinstance(advertise, str) or ":" not in advertise:
        raise ValueError(f"advertise must be 'HOST:PORT', got {advertise!r}")
    return advertise.rpartition(":")[0]
