"""What a serving knob is: one role variable (type, default, doc, rule) and, for one that feeds the
engine, how each engine says it. The engine mapping sits on the knob (`Knob.add_engine`, as
community.docker's options carry theirs), so one declaration gives the role's interface, the engine's
flag, and the flags the knob owns. specdeploy.serve.schema declares every knob (KNOBS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from specdeploy.serve.engine_words import VLLM_SPECULATIVE_FLAGS
from specdeploy.serve.rules import Check, choice


class _Unset:
    """No default in the role: an optional variable that argument_specs documents."""

    def __repr__(self) -> str:
        return "UNSET"


class _Required:
    """No default in ServingConfig: a config built by hand must say it."""

    def __repr__(self) -> str:
        return "REQUIRED"


UNSET: Any = _Unset()
REQUIRED: Any = _Required()


def _flag(value: Any) -> bool:
    return str(value).lower() in ("true", "1", "yes")


# How an inventory value becomes a ServingConfig field, by type; a knob may bring its own.
_COERCE: dict[str, Callable[[Any], Any]] = {
    "int": int,
    "float": float,
    "bool": _flag,
    "list": lambda value: tuple(str(a) for a in value or ()),
    "dict": lambda value: {str(k): str(v) for k, v in (value or {}).items()},
}
# ServingConfig's annotation of a field, by the knob's type (Knob.py_type says it where this does not).
_ANNOTATION = {"str": "str", "path": "str", "int": "int", "float": "float", "bool": "bool",
               "list": "tuple[str, ...]", "dict": "dict[str, str]"}  # fmt: skip


@dataclass(frozen=True)
class Words:
    """How one engine says a knob. What ServingConfig renders from it, when the knob is set (truthy):
    `flag`, alone for a bool, else followed by `say(value)` (or by field `value_of`'s value: SGLang's
    --ep-size is the TP size); `by_value`, one flag per value; `key`, a key of vLLM's one
    --speculative-config; `env`, an environment variable set to 1. `owns`: more flags only this knob
    may say (aliases, negations, or flags ServingConfig renders itself): serving_extra_args is refused
    every owned flag, naming the variable and `note`. `doc`: a remark in the docs' table."""

    flag: str = ""
    say: Callable[[Any], Any] = str
    value_of: str = ""
    by_value: tuple[tuple[str, str], ...] = ()
    key: str = ""
    env: str = ""
    owns: tuple[str, ...] = ()
    note: str = ""
    doc: str = ""

    @property
    def owned(self) -> tuple[str, ...]:
        flags = (self.flag,) if self.flag else ()
        return (*flags, *(f for _, f in self.by_value), *(VLLM_SPECULATIVE_FLAGS if self.key else ()), *self.owns)

    @property
    def renders_flag(self) -> bool:
        return bool(self.flag or self.by_value)

    def args(self, value: Any, config: object) -> list[str]:
        """The flags VALUE renders (CONFIG: the ServingConfig, for `value_of`)."""
        if not value or not self.renders_flag:
            return []
        if self.by_value:
            return [dict(self.by_value)[value]]
        if self.value_of:
            return [self.flag, str(getattr(config, self.value_of))]
        return [self.flag] if isinstance(value, bool) else [self.flag, str(self.say(value))]

    def cell(self) -> str:
        """This engine's words for the docs table (docs/serve.md): every flag it owns, and `doc`."""
        if self.by_value:
            said = ", ".join(f"`{value}`: `{flag}`" for value, flag in self.by_value)
        elif self.key:
            said = f"speculative config `{self.key}`"
        elif self.env:
            said = f"`{self.env}=1`"
        else:
            said = ", ".join(f"`{flag}`" for flag in self.owned)
        return f"{said} ({self.doc})" if self.doc else said


def flag(name: str, *aliases: str, say: Callable[[Any], Any] = str, value_of: str = "", doc: str = "") -> Words:
    """A flag ServingConfig renders: alone for a bool (when true), else with the value (when set)."""
    return Words(flag=name, say=say, value_of=value_of, owns=aliases, doc=doc)


def flag_by_value(**flags: str) -> Words:
    """One flag per value (SGLang's --mm-enable-dp-encoder / --no-mm-enable-dp-encoder)."""
    return Words(by_value=tuple(flags.items()))


def speculative_key(key: str, say: Callable[[Any], Any] = str) -> Words:
    """A key of vLLM's --speculative-config (which the knob then owns too), set when the knob is."""
    return Words(key=key, say=say)


def env_var(name: str) -> Words:
    """An environment variable the engine reads, set to 1 when the knob is true (an opt-in)."""
    return Words(env=name)


def rendered_by_config(*flags: str, note: str = "", doc: str = "") -> Words:
    """Flags ServingConfig renders itself (they take several fields, or sit elsewhere in the command):
    owned all the same."""
    return Words(owns=flags, note=note, doc=doc)


@dataclass(frozen=True)
class Knob:
    name: str  # the role variable is serving_<name>
    type: str  # as argument_specs spells it: str, path, int, float, bool, list, dict
    default: Any  # the role's default: a YAML value, a Jinja expression (derived), or UNSET
    doc: str  # argument_specs' description
    rule: Check | None = None  # None: no single-value rule (checked elsewhere, or free)
    field: str | None = None  # the ServingConfig field it feeds; None: the role's own (rollout, gate, prewarm)
    choices: tuple[str, ...] = ()  # also the rule, when none is given
    no_log: bool = False  # a secret: never collected into a fact, never shown
    note: str = ""  # the comment above it in defaults/main.yml
    aside: str = ""  # the comment after it, on its line
    coerce: Callable[[Any], Any] | None = None  # into its ServingConfig field; None: by type
    # Added after deployments existed: out of the digest while at its default, so that upgrading
    # specdeploy alone restarts no engine (a 25-minute load each on the user's model).
    late: bool = False
    optional: bool = False  # ServingConfig holds an empty value (0, "") as None: the engine's default
    py_type: str = ""  # ServingConfig's annotation, where the type's (_ANNOTATION) is not it
    # ServingConfig's default where it is not the role's: REQUIRED, or a value. A derived default
    # (a Jinja expression) is REQUIRED unless said here.
    built: Any = UNSET
    engines: tuple[tuple[str, Words], ...] = ()  # each engine's words for it (add_engine)

    @property
    def variable(self) -> str:
        return f"serving_{self.name}"

    @property
    def derived(self) -> bool:
        return isinstance(self.default, str) and "{{" in self.default

    @property
    def check(self) -> Check | None:
        return self.rule or (choice(self.choices) if self.choices else None)

    @property
    def annotation(self) -> str:
        base = self.py_type or _ANNOTATION[self.type]
        return f"{base} | None" if self.optional else base

    @property
    def config_default(self) -> Any:
        """ServingConfig's default for its field (REQUIRED: none)."""
        if self.built is not UNSET:
            return self.built
        return REQUIRED if self.derived or self.default is UNSET else self.to_field(self.default)

    def add_engine(self, engine: str, words: Words) -> Knob:
        """The knob, with how ENGINE says it (several Words for one engine add up)."""
        return replace(self, engines=(*self.engines, (engine, words)))

    def words(self, engine: str) -> tuple[Words, ...]:
        return tuple(w for e, w in self.engines if e == engine)

    def to_field(self, value: Any) -> Any:
        convert = self.coerce or _COERCE.get(self.type)
        if self.optional:
            return (convert(value) if convert else value) if value else None
        return convert(value) if convert else value

    def collected(self, value: Any) -> Any:
        """An inventory value as the role hands it over: numbers and flags as such, the rest as given."""
        convert = _COERCE.get(self.type) if self.type in ("int", "bool") else None
        return convert(value) if convert and value is not None else value
