"""Actor bodies (`*Host`: what runs inside a Ray actor) and the clients that make an actor look like the
plain role to its callers (`Remote*`). Roles stay plain classes; Ray appears only here and in `live.py`.

    front end ──RemoteProxy──► ProxyHost(Proxy) ──RemoteEngine──► EngineHost(EngineCore)
        │                           ├──RemoteEncoder (E/P/D: images first)──► EncoderHost(EncoderCore)
        │                           └──actor_render (re-render for decode)──┐
        └──actor_render (render per request, derender per batch)──► RenderHost(Render)
    EngineHost's runner ──RemoteFfnRanks (AFD: each MoE layer's rows)──► FfnHost(FfnWorker) × F

Streams cross actors as Ray streaming generators of batches; closing a client's stream early cancels
the actor's (an asyncio cancel in an async actor), which aborts the request there.
"""

from cluster.hosts.encoder import EncoderHost, RemoteEncoder
from cluster.hosts.engine import EngineHost, RemoteEngine, RemoteLink
from cluster.hosts.ffn import FfnHost, RemoteFfnRanks, ffn_actors
from cluster.hosts.proxy import ProxyHost, RemoteProxy
from cluster.hosts.render import RenderHost, actor_render

__all__ = [
    "EncoderHost",
    "EngineHost",
    "FfnHost",
    "ProxyHost",
    "RemoteEncoder",
    "RemoteEngine",
    "RemoteFfnRanks",
    "RemoteLink",
    "RemoteProxy",
    "RenderHost",
    "actor_render",
    "ffn_actors",
]
