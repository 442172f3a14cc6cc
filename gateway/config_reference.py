"""The configuration reference (docs/configuration.md), generated from the settings model itself.

Every key, its type, bounds, default, environment variable and description come from
:class:`gateway.config.Settings`, so the reference cannot drift from what the gateway accepts: a test
compares the file with this output, and ``specroute config docs --out docs/configuration.md`` rewrites it.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from enum import Enum
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config import Settings

ENV_PREFIX = "SPECROUTE_"

_INTRO = """\
# Configuration reference

<!-- Generated from gateway/config.py by `specroute config docs --out docs/configuration.md`; a test
     fails when this file and the settings model disagree. Edit the model's descriptions, not this file. -->

The gateway reads one YAML file (`specroute serve --config FILE`), then the environment, then the
command line. Precedence, highest first: flag (`--host`, `--port`, `--workers`), environment, file,
default. Every key can be set from the environment as `SPECROUTE_<SECTION>__<KEY>` (upper case, `__`
between levels), e.g. `SPECROUTE_ROUTING__STRATEGY=always-baseline`; lists and mappings are written as
JSON there, e.g. `SPECROUTE_AUTH__API_KEYS='["k1", "k2"]'`, and `null` unsets a key the file gives
(`SPECROUTE_ROUTING__STATE_FILE=null`). A number must be finite (`.inf` and `.nan` are refused). Unknown
keys are refused, and so is a key written twice in one mapping of the file, and a
`SPECROUTE_` variable that sets no setting (`SPECROUTE_ROUTNG__STRATEGY`), with a "did you mean". Not
settings, and accepted: the variables the project uses itself (`NON_SETTING_ENV` in `gateway/config.py`,
e.g. `SPECROUTE_GIT_REVISION`, `SPECROUTE_RUN_TOKEN`), a variable an `api_key_env` names, and the
`SPECROUTE_SERVICE_HOST`, `SPECROUTE_PORT_...` Kubernetes sets for a Service named `specroute`.

Invalid configuration stops the gateway before it starts, with one line on stderr that names each bad key
and where its value came from, e.g.
`invalid configuration: routing.strategy: Input should be 'adaptive', 'classifier', 'always-speculative'
or 'always-baseline' (from environment variable SPECROUTE_ROUTING__STRATEGY)`.

`deploy/config/example.yaml` is a complete, commented example; `deploy/config/demo.yaml` a small local one.
"""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One key of the reference."""

    key: str
    type: str
    default: str
    env: str
    description: str


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(args) < len(get_args(annotation)):
            return args[0], True
    return annotation, False


def _model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The settings section a field holds (and whether it holds a list of them), if it holds one."""
    inner, _ = _strip_optional(annotation)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return inner, False
    if get_origin(inner) is list:
        (item,) = get_args(inner)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item, True
    return None, False


def type_name(annotation: Any) -> str:
    """A field's type in the words of the YAML file: ``list of string``, ``one of a, b``, ``number``."""
    inner, optional = _strip_optional(annotation)
    if isinstance(inner, type) and issubclass(inner, Enum):
        text = "one of " + ", ".join(f"`{m.value}`" for m in inner)
    elif get_origin(inner) is Literal:
        text = "one of " + ", ".join(f"`{a}`" for a in get_args(inner))
    elif get_origin(inner) is list:
        text = f"list of {type_name(get_args(inner)[0])}"
    else:
        names = {bool: "boolean", int: "integer", float: "number", str: "string"}
        text = names.get(inner, getattr(inner, "__name__", str(inner)))
        text = {"HttpUrl": "URL", "Path": "file path"}.get(text, text)
    return f"{text} or null" if optional else text


def _bounds(info: FieldInfo) -> str:
    words = []
    for m in info.metadata:
        if isinstance(m, Ge):
            words.append(f"≥ {m.ge}")
        elif isinstance(m, Gt):
            words.append(f"> {m.gt}")
        elif isinstance(m, Le):
            words.append(f"≤ {m.le}")
        elif isinstance(m, Lt):
            words.append(f"< {m.lt}")
        elif isinstance(m, MinLen):
            words.append(f"at least {m.min_length} long")
        elif isinstance(m, MaxLen):
            words.append(f"at most {m.max_length} long")
    return ", ".join(words)


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value: Any = info.default_factory()  # type: ignore[call-arg]
    else:
        value = info.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, Enum):
        value = value.value
    return f"`{json.dumps(value, default=str)}`"


def rows(model: type[BaseModel] = Settings, prefix: str = "", env: str | None = ENV_PREFIX) -> list[Row]:
    """Every key under ``model``, depth first; a section met twice is listed once and referred to after."""
    out: list[Row] = []
    seen: dict[type[BaseModel], str] = {}
    _walk(model, prefix, env, out, seen)
    return out


def _walk(
    model: type[BaseModel], prefix: str, env: str | None, out: list[Row], seen: dict[type[BaseModel], str]
) -> None:
    for name, info in model.model_fields.items():
        key = f"{prefix}{name}"
        var = f"{env}{name.upper()}" if env is not None else None
        section, is_list = _model_of(info.annotation)
        if section is not None:
            if section in seen and section is not Settings:
                out.append(
                    Row(
                        key=key,
                        type="section",
                        default="",
                        env="",
                        description=f"the keys of `{seen[section]}`",
                    )
                )
                continue
            seen[section] = key
            if is_list:
                text = (info.description or "").strip()
                out.append(
                    Row(
                        key=key,
                        type="list of sections",
                        default=_default(info),
                        env=f"`{var}` (JSON)" if var else "",
                        description=text,
                    )
                )
                _walk(section, f"{key}[].", None, out, seen)
            else:
                _walk(section, f"{key}.", f"{var}__" if var else None, out, seen)
            continue
        bounds = _bounds(info)
        text = " ".join(p for p in ((info.description or "").strip(), f"({bounds})" if bounds else "") if p)
        json_note = " (JSON)" if type_name(info.annotation).startswith("list") else ""
        out.append(
            Row(
                key=key,
                type=type_name(info.annotation),
                default=_default(info),
                env=f"`{var}`{json_note}" if var else "",
                description=text,
            )
        )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


_HEADER = "| key | type | default | environment | description |\n|---|---|---|---|---|"


def markdown() -> str:
    """docs/configuration.md: the introduction, then one table per top-level section."""
    parts = [_INTRO]
    section = None
    for row in rows():
        top = row.key.split(".")[0].split("[")[0]
        if top != section:
            section = top
            parts.append(f"\n## `{section}`\n\n{_HEADER}")
        cells = (f"`{row.key}`", row.type, row.default, row.env, row.description)
        parts.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(parts) + "\n"
