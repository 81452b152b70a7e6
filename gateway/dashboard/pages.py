"""Server-rendered pages: the layout (navigation, CSRF token, sign-out) around each page's
body from ``templates/``. The bodies hold the structure (headings, forms, empty tables);
``static/dashboard.js`` fills them from the admin API and the event stream."""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from string import Template

from schemas import subjects

PAGES = {
    "overview": "Overview",
    "events": "Live events",
    "chains": "Chains & steering",
    "models": "Models",
    "rules": "Rules",
    "weights": "Weights & benches",
    "keys": "Keys",
    "spend": "Spend & limits",
    "log": "Request log",
    "reports": "Replay reports",
}

# Every event kind, offered by the events page's filter (and, on the body, listened for).
_KIND_OPTIONS = "".join(f"<option>{html.escape(k)}</option>" for k in subjects.EVENT_KINDS)

# The pages that chart load uPlot and the charts' code; the others spare the requests.
CHARTED = frozenset({"overview", "spend"})
_CHART_HEAD = '<link rel="stylesheet" href="/dashboard/static/uPlot.min.css">\n'
_CHART_SCRIPTS = (
    '<script src="/dashboard/static/uPlot.iife.min.js"></script>\n'
    '<script src="/dashboard/static/charts.js"></script>\n'
)


@cache
def _template(name: str) -> Template:
    return Template((resources.files(__package__) / "templates" / name).read_text("utf-8"))


def _nav(current: str) -> str:
    return "".join(
        f'<a href="/dashboard/{page}"{" aria-current=page" if page == current else ""}>'
        f"{html.escape(title)}</a>"
        for page, title in PAGES.items()
    )


def render_page(page: str, csrf: str, who: str) -> bytes:
    """The whole HTML of ``page`` for a session whose CSRF token is ``csrf``."""
    body = _template(f"{page}.html").substitute(kind_options=_KIND_OPTIONS)
    return (
        _template("layout.html")
        .substitute(
            page=page,
            title=html.escape(PAGES[page]),
            csrf=html.escape(csrf),
            nav=_nav(page),
            who=html.escape(who),
            body=body,
            head=_CHART_HEAD if page in CHARTED else "",
            scripts=_CHART_SCRIPTS if page in CHARTED else "",
            event_kinds=" ".join(subjects.EVENT_KINDS),
        )
        .encode()
    )


def render_signin(csrf: str, error: str = "", after: str = "overview") -> bytes:
    """The sign-in page carrying the form token ``csrf`` (with ``error`` shown, when given)
    that goes on to the page ``after``."""
    shown = f'<p class="error" role="alert">{html.escape(error)}</p>' if error else ""
    return (
        _template("signin.html")
        .substitute(error=shown, csrf=html.escape(csrf), after=html.escape(after))
        .encode()
    )
