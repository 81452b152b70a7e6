"""The operator dashboard at ``/dashboard``: server-rendered pages, a little plain JS, and
sessions as signed, expiring cookies. It owns no routing state: everything it shows comes
from the admin API and the event stream, and every change it makes is an admin command
(``llmgw.admin.<area>.<verb>``) sent through the admin HTTP API's own handlers."""

from gateway.dashboard.server import Dashboard
from gateway.dashboard.session import Session, SessionSigner

__all__ = ["Dashboard", "Session", "SessionSigner"]
