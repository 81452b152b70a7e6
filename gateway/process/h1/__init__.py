"""The builtin HTTP/1.1 engine (``server.engine: builtin``): the gateway's own server on its
event loop, an ``asyncio.Protocol`` per connection with llhttp (``httptools``) as the parser.

``server`` (the listening side, lifespan, shutdown), ``connection`` (one client connection:
parsing, refusals, pipelining, flow control) and ``cycle`` (one request's ASGI receive and
send). Nothing is re-exported here.
"""

from __future__ import annotations

__all__: list[str] = []
