"""Loading the YAML config: ``${VAR}`` expansion, validation, one precise message on failure.

``load_config`` raises ``ConfigError`` whose message names the file, the key's path
(``models[2].route[0].weight``) or the line and column, and why; nothing is served from a
half-valid config.

A message about a config never quotes a value from it: a value may be an upstream key, and
the message travels far (reload answers, log lines, ``AdminExecuted`` events kept in
JetStream, CLI output). YAML syntax errors give the line, column and the parser's problem
without its snippet; validation errors give pydantic's message, never its ``input_value``.

Routers and their ``router_params`` belong to the actors (``actors.strategies``), so this module
checks their shape only; a process that runs the actors passes ``routers`` (the strategies'
validator) so that a bad router or parameter is refused at load time with the same precise
message (``gateway.process.actor_host``).
"""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, get_args

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from schemas.config import DatabaseConfig, GatewayConfig, RoutingConfig

if TYPE_CHECKING:
    from pydantic_core import ErrorDetails

    from schemas.config import ModelConfig


class RouterCheck(Protocol):
    """Validates a router name and its params and, given the model, that the model can start
    under it; raises ValueError saying what is known."""

    def __call__(
        self, name: str, params: dict[str, Any], model: ModelConfig | None = None, /
    ) -> object: ...


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
DEMO_CONFIG = "demo.yaml"
_BARE_MIN = 8  # shorter values are masked in validation messages only when quoted


class ConfigError(Exception):
    """The configuration cannot be used; the message says where and why."""


def load_config(path: str | Path | None, *, routers: RouterCheck | None = None) -> GatewayConfig:
    """Read, expand and validate the config at ``path`` (None: the bundled demo config);
    ``routers`` also validates every router and its params (None: their shape only).

    Raises ConfigError.
    """
    if path is None:
        text = resources.files("gateway").joinpath(DEMO_CONFIG).read_text()
        return parse_config(text, source=f"<bundled {DEMO_CONFIG}>", routers=routers)
    return parse_config(_read(path), source=str(path), routers=routers)


def parse_config(
    text: str, *, source: str = "<config>", routers: RouterCheck | None = None
) -> GatewayConfig:
    """Validate config ``text`` (``routers``: as :func:`load_config`). Raises ConfigError
    naming ``source`` and the key's path."""
    config = _validate(_expanded(_parse_mapping(text, source), source), source)
    if routers is not None:
        _check_routers(config, source, routers)
    return _apply_env_overrides(config, source)


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:  # the reason only: never the bytes it quotes
        raise ConfigError(f"{path}: cannot read: not UTF-8 text (byte {exc.start})") from None


def _parse_mapping(text: str, source: str) -> dict[str, Any]:
    """The YAML document as a mapping. Raises ConfigError that never quotes the text."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except RecursionError:  # thousands of levels of brackets
        raise ConfigError(f"{source}: nested too deeply") from None
    except yaml.YAMLError as exc:
        # ``from None``: the parser's own text (in a chained traceback) quotes the line.
        raise ConfigError(f"{source}: {yaml_problem(exc, text)}") from None
    if raw is None:
        # Most often a file caught half written (an editor's save, a deploy's copy): read as
        # all defaults, a reload would have removed every model and key. ``{}`` says it.
        raise ConfigError(f"{source}: the file holds no settings (write {{}} for the defaults)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    return raw


# A config field's name (snake_case letters) is named; any other key is not quoted, as no
# text of the file is: it may be a secret written where a key goes.
_NAMEABLE_KEY = re.compile(r"[a-z][a-z_]{0,39}")


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, but a key given twice in one mapping is an error: PyYAML keeps the
    last, so a second ``server:`` section silently dropped the first's settings. A key
    repeated through a merge (``<<: *base``) is an override, as YAML means it."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        # A scalar tagged !!map comes here too: the base class refuses it with its message.
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, list | dict):
                continue  # unhashable: the constructor refuses it with its own message
            if key in seen:
                named = str(key) if _NAMEABLE_KEY.fullmatch(str(key)) else "a key"
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"{named} is given twice in one mapping (first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _validate(expanded: Any, source: str) -> GatewayConfig:
    """``GatewayConfig`` from the expanded document. Raises ConfigError naming the first
    problem's key path, never its value."""
    try:
        return GatewayConfig.model_validate(expanded)
    except ValidationError as exc:
        errors = exc.errors()
        err, same = _telling(errors)
        where = format_path(err["loc"]) or "(top level)"
        others = len(errors) - 1 - same
        more = f" (and {others} more problems)" if others > 0 else ""
        msg = _validation_message(err).removeprefix("Value error, ")
        raise ConfigError(f"{source}: {where}: {msg}{more}") from None


_SCALAR_MEMBERS = frozenset({"str", "int", "float", "bool"})


def _member(part: int | str) -> bool:
    """Whether a location part names a union's member (``str``, ``ApiKeyConfig``), which no
    config field does (fields are snake_case)."""
    return isinstance(part, str) and (
        part in _SCALAR_MEMBERS or part[:1].isupper() or part.startswith(("function-", "literal["))
    )


def _telling(errors: list[ErrorDetails]) -> tuple[ErrorDetails, int]:
    """The error to show and how many of the others are the same problem. For a value that
    may be a string or a mapping (``api_keys: ["k", {key, min_role}]``), pydantic reports
    first that the mapping is no string; the mapping's own problem (``min_role``) tells, its
    path without the member's name."""
    first = errors[0]
    loc = first["loc"]
    if not loc or not _member(loc[-1]) or not first["type"].endswith("_type"):
        return first, 0
    at = len(loc) - 1
    for err in errors[1:]:
        other = err["loc"]
        if len(other) > at + 1 and other[:at] == loc[:at] and _member(other[at]):
            if other[at] != loc[-1]:
                return {**err, "loc": (*other[:at], *other[at + 1 :])}, 1
    return first, 0


# The spec's knobs keep the spec's environment variable names; the environment wins.
_ROUTING_ENV: dict[str, tuple[str, str]] = {
    "CIRCUIT_FAILURE_THRESHOLD": ("circuit", "failure_threshold"),
    "CIRCUIT_COOLDOWN_SECONDS": ("circuit", "cooldown_seconds"),
    "CIRCUIT_MIN_AVAILABILITY": ("circuit", "min_availability"),
    "ROUTER_HEALTH_EWMA_ALPHA": ("circuit", "ewma_alpha"),
    "ROUTING_AFFINITY_ENABLED": ("affinity", "enabled"),
    "ROUTING_PREFILL_AWARE_ENABLED": ("prefill", "enabled"),
    "ROUTING_PREFILL_INTERVENE_TOKENS": ("prefill", "intervene_tokens"),
    "ROUTING_PREFILL_ELEPHANT_TOKENS": ("prefill", "elephant_tokens"),
    "ROUTING_PREFILL_ELEPHANT_LIMIT": ("prefill", "elephant_limit"),
    "ROUTING_PREFILL_AFFINITY_CEILING": ("prefill", "affinity_ceiling"),
    "ROUTING_PREFILL_HINT_TTL_SEC": ("prefill", "hint_ttl_seconds"),
    "TRUST_PROXY_HEADERS": ("", "trust_proxy_headers"),
}


def _apply_env_overrides(config: GatewayConfig, source: str) -> GatewayConfig:
    routing = config.routing.model_dump()
    for var, (section, key) in _ROUTING_ENV.items():
        if var in os.environ:
            (routing[section] if section else routing)[key] = os.environ[var]
    admin_key = os.environ.get("LLMGW_ADMIN_KEY") or config.admin_key
    try:
        validated = RoutingConfig.model_validate(routing)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(
            f"{source}: environment override of routing.{format_path(err['loc'])}: "
            f"{_validation_message(err)}"
        ) from None
    dashboard = config.dashboard
    if os.environ.get("LLMGW_DASHBOARD_SECRET"):
        dashboard = dashboard.model_copy(update={"secret": os.environ["LLMGW_DASHBOARD_SECRET"]})
    return database_from_env(config, source).model_copy(
        update={"routing": validated, "admin_key": admin_key, "dashboard": dashboard}
    )


def database_from_env(config: GatewayConfig, source: str) -> GatewayConfig:
    """``LLMGW_DATABASE_URL``, when set, wins over ``database.url`` (a password kept out of
    the file). Raises ConfigError (never quoting the value)."""
    url = os.environ.get("LLMGW_DATABASE_URL")
    if not url:
        return config
    try:
        database = DatabaseConfig.model_validate({**config.database.model_dump(), "url": url})
    except ValidationError as exc:
        raise ConfigError(
            f"{source}: LLMGW_DATABASE_URL: {_validation_message(exc.errors()[0])}"
        ) from None
    return config.model_copy(update={"database": database})


# PyYAML quotes syntax tokens (``'<block end>'``, ``','``) and, sometimes, text of the file
# (an alias or tag name, an escape character): only the former are kept.
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_TOKEN = re.compile(r"<[a-z ]+>|[,:{}\[\]?|>-]")


def _unquote_values(text: str) -> str:
    def keep_tokens(m: re.Match[str]) -> str:
        return m.group(0) if _TOKEN.fullmatch(m.group(0)[1:-1]) else ""

    return " ".join(_QUOTED.sub(keep_tokens, text).split())


def _at(line: int, column: int) -> str:
    return f"line {line + 1}, column {column + 1}"


def yaml_problem(exc: yaml.YAMLError, text: str) -> str:
    """``line L, column C: not valid YAML: <problem>`` for a YAML error, without the parser's
    snippet of the file or any text it quotes from it."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = _unquote_values(exc.problem or "syntax error")
        out = f"{_at(mark.line, mark.column)}: not valid YAML: {problem}"
        if exc.context and exc.context_mark is not None:
            ctx = exc.context_mark
            out += f" ({_unquote_values(exc.context)} at {_at(ctx.line, ctx.column)})"
        return out
    if isinstance(exc, yaml.reader.ReaderError):
        before = text[: exc.position]
        where = _at(before.count("\n"), exc.position - (before.rfind("\n") + 1))
        return f"{where}: not valid YAML: {_unquote_values(str(exc.reason))}"
    return f"not valid YAML ({type(exc).__name__})"


def _validation_message(err: ErrorDetails) -> str:
    """Pydantic's message for one error, never its ``input_value`` (str(ValidationError)
    would print it). A message that still contains the input (a validator quoting its value)
    gets it masked (quoted, or bare when too long to occur by chance)."""
    msg = str(err["msg"])
    value = err.get("input")
    if isinstance(value, str) and value:
        msg = msg.replace(repr(value), "…")
        if len(value) >= _BARE_MIN:
            msg = msg.replace(value, "…")
    return msg


def _tagged_fields(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[str]:
    """The fields of ``model`` and of the blocks under it that hold a tagged union (whose
    member pydantic names by its tag in a location: ``quota_source.local.window``)."""
    seen.add(model)
    tagged: set[str] = set()
    for name, field in model.model_fields.items():
        pending: list[Any] = [field, field.annotation]
        while pending:  # the type's members and their ``Annotated`` metadata, all the way down
            kind = pending.pop()
            if isinstance(kind, FieldInfo):
                if kind.discriminator is not None:
                    tagged.add(name)
                continue
            pending += get_args(kind)
            if isinstance(kind, type) and issubclass(kind, BaseModel) and kind not in seen:
                tagged |= _tagged_fields(kind, seen)
    return tagged


_TAGGED_FIELDS = frozenset(_tagged_fields(GatewayConfig, set()))


def format_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """Render a pydantic location as ``models[2].route[0].weight``. A key no config field
    could be named (an unknown one: a secret pasted where a key goes, a line break that
    would forge a log line) reads ``<a key>``, as no text of the file is quoted."""
    out = ""
    previous: int | str | None = None
    for part in loc:
        tag, previous = previous in _TAGGED_FIELDS, part
        if tag or _member(part):  # a union's member (``str``, ``ApiKeyConfig``, a tag): no key
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _NAMEABLE_KEY.fullmatch(part) else "<a key>"
            out += f".{name}" if out else name
    return out


def _expanded(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """``raw`` with its environment variables expanded and its aliases copied out. Raises
    ConfigError for a missing variable, an alias that holds itself, too many values."""
    try:
        expanded: dict[str, Any] = _expand(raw, (), source, [_MAX_VALUES])
    except RecursionError:  # ``a: &a [*a]``, or a structure nested too deeply to copy
        raise ConfigError(f"{source}: nested too deeply, or an alias holds itself") from None
    return expanded


_MAX_VALUES = 1_000_000
"""Values a config may expand to: far past any real one (a few thousand), short of what a
few lines of aliases repeating aliases make (ten of ten of ten...: a billion)."""


def _expand(node: Any, path: tuple[int | str, ...], source: str, left: list[int]) -> Any:
    left[0] -= 1
    if left[0] < 0:
        raise ConfigError(f"{source}: expands to more than {_MAX_VALUES:,} values (aliases)")
    if isinstance(node, str):

        def sub(m: re.Match[str]) -> str:
            name = m.group(1)
            # Set but empty is refused as unset is: ``api_key: ${K}`` with K="" made the
            # route keyless (sent upstream without a credential) instead of failing.
            value = os.environ.get(name)
            if not value:
                why = "is not set" if value is None else "is set but empty"
                raise ConfigError(
                    f"{source}: {format_path(path)}: environment variable {name} {why}"
                )
            return value

        return _VAR.sub(sub, node)
    if isinstance(node, dict):
        return {k: _expand(v, (*path, str(k)), source, left) for k, v in node.items()}
    if isinstance(node, list):
        return [_expand(v, (*path, i), source, left) for i, v in enumerate(node)]
    return node


def _check_routers(config: GatewayConfig, source: str, validate: RouterCheck) -> None:
    try:
        validate(config.routing.default_router, {})
    except ValueError as exc:
        raise ConfigError(f"{source}: routing.default_router: {exc}") from None
    for i, model in enumerate(config.models):
        name = model.router or config.routing.default_router
        try:
            validate(name, model.router_params)
        except ValueError as exc:
            key = "router" if model.router else "router_params"
            if model.router and "params" in str(exc):
                key = "router_params"
            raise ConfigError(f"{source}: models[{i}].{key}: {exc}") from None
        try:
            validate(name, model.router_params, model)
        except ValueError as exc:  # the model cannot start under its router
            raise ConfigError(f"{source}: models[{i}]: {exc}") from None


def load_sections(path: str | Path | None, *sections: str) -> GatewayConfig:
    """Only the top-level ``sections`` of the config at ``path`` (None: the bundled demo),
    validated; everything else is left at its default and unread.

    What operator commands use: ``llmgw keys``/``logs`` need ``database`` (and ``bus``), not
    the environment variables the models' credentials name. Raises ConfigError (which never
    quotes the file's values).
    """
    if path is None:
        return load_config(None)
    source = str(path)
    raw = _parse_mapping(_read(path), source)
    picked = {name: raw[name] for name in sections if name in raw}
    config = _validate(_expanded(picked, source), source)
    return database_from_env(config, source) if "database" in sections else config


def redacted(url: str) -> str:
    """``url`` without the password of its credentials (``nats://user:***@host``)."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url)
