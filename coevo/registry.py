"""A tiny name -> factory registry used for every extension point.

Backends, environments, proposers, executors and gate policies are looked up by name; an
unknown name fails with the list of known ones (as trl's reward registry does), never with a
bare KeyError.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Callable
from typing import Any, Generic, TypeVar
from urllib.parse import parse_qsl

from coevo.errors import CoevoError

T = TypeVar("T")


class UnknownName(CoevoError, KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, what: str):
        self.what = what
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return deco

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "(none)"
            raise UnknownName(f"unknown {self.what} {name!r}; known: {known}") from None

    def check(self, name: str) -> str:
        """`name` when registered, else a ValueError listing the known names: the body of a
        pydantic validator of a config field that names an entry."""
        try:
            self.get(name)
        except UnknownName as exc:
            raise ValueError(str(exc)) from None
        return name

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


def parse_query(text: str) -> dict[str, Any]:
    """The options of a spec's `?key=value&...` part; values read as JSON when they parse
    (`3`, `true`, `[1,2]`), else kept as strings.

    >>> parse_query("n=3&tokenizer=/models/q&exact=true")
    {'n': 3, 'tokenizer': '/models/q', 'exact': True}
    """
    out: dict[str, Any] = {}
    for key, raw in parse_qsl(text, keep_blank_values=True, strict_parsing=False):
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


class BadOptions(CoevoError):
    """Options a factory does not take (an unknown key, a missing or doubled argument)."""


def call_with_options(fn: Callable[..., T], *args: Any, **options: Any) -> T:
    """`fn(*args, **options)`, after checking the options against its signature, so a key it
    does not take is a `BadOptions` naming the key (before any slow loading starts), never a
    TypeError from deep inside."""
    try:
        inspect.signature(fn).bind(*args, **options)
    except TypeError as e:
        raise BadOptions(f"{e}; options given: {', '.join(sorted(options)) or '(none)'}") from None
    except ValueError:  # no signature to check (a builtin): let the call decide
        pass
    return fn(*args, **options)


def validate_options(registry: "Registry[Any]", name: str, options: dict[str, Any] | None) -> Any:
    """`options` validated by the `Options` pydantic model of `registry`'s `name`; a failure is
    one ValueError line naming the key ("gamma: Input should be ... (estimator 'gigpo')")."""
    from pydantic import ValidationError

    try:
        return registry.get(name).Options.model_validate(dict(options or {}))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise ValueError(f"{where + ': ' if where else ''}{msg} ({registry.what} {name!r})") from None


def choice_validators(registry: "Registry[Any]", name_field: str, options_field: str) -> tuple:
    """Pydantic field validators for a config pair (`name_field` names an entry of `registry`,
    `options_field` holds its options): an unknown name lists the known ones, bad options
    name their key. Unpack into two class attributes of the model."""
    from pydantic import ValidationInfo, field_validator

    def known(cls: Any, v: str) -> str:
        return registry.check(v)

    def options(cls: Any, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if name_field in info.data:  # else the name itself was rejected
            validate_options(registry, info.data[name_field], v)
        return v

    return field_validator(name_field)(known), field_validator(options_field)(options)


def import_dotted(module_name: str, attr: str, what: str) -> Any:
    """`module_name` imported, then the dotted `attr` inside it ("Class.method"), which must be
    callable. Errors are CoevoError prefixed with `what` (e.g. "python criterion 'm:f'");
    an ImportError is re-raised as is, for callers that explain it in their own terms."""
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CoevoError(f"{what}: {module_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CoevoError(f"{what}: {module_name}:{attr} is not callable")
    return obj
