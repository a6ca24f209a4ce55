"""A decoded body checked against its API's request type, msgspec's refusal said as a 400
naming the offending path, as OpenAI and vLLM name it (`messages[0].content`); and an
engine's answer that its exact declaration refuses (a field it does not know) checked on
the fields it does know (`known`)."""

from __future__ import annotations

import re
from functools import cache
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin, get_type_hints

import msgspec

from .errors import InvalidRequest

T = TypeVar("T")

_AT = re.compile(r" - at `\$\.?(.*)`$")  # msgspec's path to the offending value
_MISSING = re.compile(r"^Object missing required field `(.+)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.+)`$")  # a type that forbids them


def validated(body: dict, kind: type[T]) -> T:
    """`body` as `kind`, strictly (a string is never read as a number); fields `kind` does
    not declare are left to whoever reads them."""
    try:
        return msgspec.convert(body, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise invalid(exc) from None


def invalid(exc: msgspec.ValidationError) -> InvalidRequest:
    """msgspec's "Expected `int`, got `str` - at `$.n`" as "`n`: expected `int`, got
    `str`." with `param` "n"; a missing field is named as the field."""
    text = str(exc)
    where = _AT.search(text)
    why = text[: where.start()] if where else text
    path = where.group(1) if where else ""
    if missing := _MISSING.match(why):
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return InvalidRequest(f"`{path}` is required.", param=path)
    if unknown := _UNKNOWN.match(why):
        path = f"{path}.{unknown.group(1)}" if path else unknown.group(1)
        return InvalidRequest(f"Unknown parameter: `{path}`.", param=path)
    if not path:
        return InvalidRequest(f"Invalid request: {why}.")
    return InvalidRequest(f"`{path}`: {why[:1].lower()}{why[1:]}.", param=path)


def decoded(raw: bytes, kind: type[T]) -> T:
    """A body's bytes decoded straight into `kind` (the local engine's way: it logs nothing,
    so it needs no dict of what was sent), refused as `validated` refuses."""
    try:
        return msgspec.json.decode(raw, type=kind)
    except msgspec.ValidationError as exc:
        raise invalid(exc) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Malformed JSON body: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The body is not valid UTF-8: {exc}") from None
    except RecursionError:
        raise InvalidRequest("The body is nested too deep to read.") from None


def known(data: Any, kind: type) -> None:
    """Check the fields of a decoded answer that `kind` declares (at every depth), as
    `kind` types them; fields it does not declare are not read (they pass on as sent).
    Raises `msgspec.ValidationError`."""
    msgspec.convert(data, _open(kind))


@cache
def _open(kind: Any) -> Any:
    """`kind` with every struct in it (at any depth) taking fields it does not declare:
    the same fields, types and defaults, so msgspec checks them as fast as it decodes."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        hints = get_type_hints(kind, include_extras=True)
        fields = [(f.name, _open(hints[f.name]), _default(f)) for f in msgspec.structs.fields(kind)]
        return msgspec.defstruct(kind.__name__, fields, kw_only=True)
    args = get_args(kind)
    if not args:
        return kind
    origin = get_origin(kind)
    if origin is Annotated:
        return Annotated[(_open(args[0]), *kind.__metadata__)]
    if origin in (Union, UnionType):
        return Union[tuple(_open(a) for a in args)]  # noqa: UP007
    return origin[tuple(_open(a) for a in args)]


def _default(field: msgspec.structs.FieldInfo) -> Any:
    if field.default_factory is not msgspec.NODEFAULT:
        return msgspec.field(default_factory=field.default_factory)
    return field.default
