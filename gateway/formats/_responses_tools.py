"""Responses tools <-> canonical chat tools: function tools and custom (freeform) tools.

A custom tool (``{"type": "custom", "name", "description"?, "format"?}``, Codex's
``apply_patch``) takes free text, not JSON arguments. Chat completions has the same tool since
gpt-5 (``{"type": "custom", "custom": {...}}``, a call ``{"id", "type": "custom", "custom":
{"name", "input"}}``), so it is sent on as that: an upstream speaking chat completions
(openai_compat, azure) takes it, the translating adapters refuse it (400, naming the tool).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.formats._common import JSON, json_text, new_id, want_dict, want_list, want_str
from gateway.formats.openai_chat import BOOLEAN, OBJECT, STRING, check_types
from schemas import InvalidRequestError, UpstreamBadResponseError

if TYPE_CHECKING:
    from gateway.formats.client_paths import Origins

# A tool's documented fields: those forwarded upstream must have their type here, not fail
# there.
_TOOL_FIELDS = {"description": STRING, "parameters": OBJECT, "strict": BOOLEAN}
_CUSTOM_FIELDS = {"description": STRING, "format": OBJECT}
_KINDS = ("function", "custom")
CALL_TEXT = {"function_call": "arguments", "custom_tool_call": "input"}
"""Per tool call output item type: the key of the text the model wrote for it."""


def convert_tools(tools: list[Any], origins: Origins | None) -> list[JSON]:
    """Responses ``tools`` as chat's. Raises InvalidRequestError for a hosted tool."""
    checked = [want_dict(t, f"tools[{i}]") for i, t in enumerate(tools)]
    hosted = [(i, t.get("type")) for i, t in enumerate(checked) if t.get("type") not in _KINDS]
    if hosted:
        names = ", ".join(sorted({str(kind) for _, kind in hosted}))
        raise InvalidRequestError(
            f"tools: {names} tools are not supported by this gateway; only function and "
            "custom tools are",
            param=f"tools[{hosted[0][0]}].type",
        )
    out = []
    for i, tool in enumerate(checked):
        path = f"tools[{i}]"
        kind = tool["type"]
        if kind == "custom":
            check_types(tool, _CUSTOM_FIELDS, path)
            spec: JSON = {"name": want_str(tool, "name", path)}
            for key in ("description", "format"):
                if tool.get(key) is not None:
                    spec[key] = tool[key]
        else:
            check_types(tool, _TOOL_FIELDS, path)
            spec = {"name": want_str(tool, "name", path)}
            if tool.get("parameters") is not None:
                spec["parameters"] = want_dict(tool["parameters"], f"{path}.parameters")
            if isinstance(tool.get("description"), str):
                spec["description"] = tool["description"]
            if isinstance(tool.get("strict"), bool):
                spec["strict"] = tool["strict"]
        out.append({"type": kind, kind: spec})
        if origins is not None:
            origins[f"{path}.{kind}"] = path
    return out


def forces_a_tool(choice: Any) -> bool:
    """Whether a Responses ``tool_choice`` asks for a tool call (``required``, or one that
    names tools: a function, a custom or hosted tool, ``allowed_tools``), which a request
    without ``tools`` cannot get; ``auto`` and ``none`` ask for none."""
    return choice == "required" or isinstance(choice, dict)


def convert_tool_choice(choice: Any) -> Any:
    """Responses ``tool_choice`` as chat's. Raises InvalidRequestError for a hosted tool's."""
    if choice in ("auto", "none", "required"):
        return choice
    kind = want_dict(choice, "tool_choice").get("type")
    if kind in _KINDS:
        return {"type": kind, kind: {"name": want_str(choice, "name", "tool_choice")}}
    if kind == "allowed_tools":
        named = []
        for j, tool in enumerate(want_list(choice.get("tools"), "tool_choice.tools")):
            path = f"tool_choice.tools[{j}]"
            allowed = want_dict(tool, path).get("type")
            if allowed not in _KINDS:
                raise InvalidRequestError(
                    f"{path}.type: only function and custom tools can be allowed",
                    param=f"{path}.type",
                )
            named.append({"type": allowed, allowed: {"name": want_str(tool, "name", path)}})
        mode = choice.get("mode")
        if mode not in ("auto", "required"):
            raise InvalidRequestError(
                "tool_choice.mode: must be auto or required", param="tool_choice.mode"
            )
        return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": named}}
    raise InvalidRequestError(
        f"tool_choice.type: '{kind}' is not supported by this gateway", param="tool_choice.type"
    )


def tool_call(item: JSON, path: str, out: list[JSON], origins: Origins | None) -> None:
    """A ``function_call`` or ``custom_tool_call`` input ``item`` as a call of the assistant
    message ending ``out`` (appended if need be). Raises InvalidRequestError."""
    if item.get("type") == "custom_tool_call":
        kind, text_key = "custom", "input"
        text = item.get("input", "")
    else:
        kind, text_key = "function", "arguments"
        text = item.get("arguments", "")
        if isinstance(text, dict):
            text = json_text(text)
    if not isinstance(text, str):
        where = f"{path}.{text_key}"
        raise InvalidRequestError(f"{where}: must be a string", param=where)
    call = {
        "id": want_str(item, "call_id", path),
        "type": kind,
        kind: {"name": want_str(item, "name", path), text_key: text},
    }
    last = out[-1] if out else None
    # Responses lists the assistant's text and each of its calls as separate items; chat
    # wants them in one assistant message.
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    if origins is not None:
        at = f"messages[{len(out) - 1}].tool_calls[{len(out[-1]['tool_calls']) - 1}]"
        origins[at] = origins[f"{at}.{kind}"] = path
        origins[f"{at}.{kind}.{text_key}"] = f"{path}.{text_key}"
        origins[f"{at}.id"] = f"{path}.call_id"


def call_item(call: Any, status: str) -> JSON:
    """A chat answer's tool call as a ``function_call`` or ``custom_tool_call`` output item.

    Raises UpstreamBadResponseError when it has neither a function nor a custom tool."""
    if isinstance(call, dict) and call.get("type") == "custom":
        custom = call.get("custom")
        if not isinstance(custom, dict):
            raise UpstreamBadResponseError(
                "upstream custom tool call has no custom tool", kind="bad_response"
            )
        text = custom.get("input")
        return {
            "id": new_id("ctc_"),
            "type": "custom_tool_call",
            "call_id": call.get("id") or new_id("call_"),
            "name": custom.get("name") or "",
            "input": text if isinstance(text, str) else "",
            "status": status,
        }
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise UpstreamBadResponseError("upstream tool call has no function", kind="bad_response")
    arguments = function.get("arguments") or ""
    return {
        "id": new_id("fc_"),
        "type": "function_call",
        "call_id": call.get("id") or new_id("call_"),
        "name": function.get("name") or "",
        "arguments": arguments if isinstance(arguments, str) else json_text(arguments),
        "status": status,
    }


def streamed_item(call: JSON, spec: JSON) -> JSON:
    """The output item a streamed chat tool ``call`` opens, its text still empty; ``spec``:
    the call's ``custom`` tool (a ``custom_tool_call``) or function (a ``function_call``)."""
    custom = spec is call.get("custom")
    return {
        "id": new_id("ctc_" if custom else "fc_"),
        "type": "custom_tool_call" if custom else "function_call",
        "call_id": call.get("id") or new_id("call_"),
        "name": spec.get("name") or "",
        "input" if custom else "arguments": "",
        "status": "in_progress",
    }
