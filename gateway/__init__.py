"""The HTTP ingress: client wire formats, upstream adapters, dispatch and the ASGI app."""
