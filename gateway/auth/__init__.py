"""Who is calling: gateway API keys, admins, callers and their upstream credentials.

``gate`` (the auth gate every request passes), ``admin_access`` (who is an admin),
``callers`` (the ingress's side of callers and credentials) and ``provider_secrets``
(database-added provider keys' secrets as the ingress holds them).
"""

from __future__ import annotations

# Its modules are imported by name; nothing is re-exported here.
__all__: list[str] = []
