"""Request parameter rules shared by the routes: path names, filters, paging.

Imports neither zmq nor subscriber/. Each rule lives here once, so OpenAPI, validation and
the error text (api.errors) cannot drift apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from functools import cache
from typing import Annotated, Any, ClassVar

from fastapi import HTTPException, Path, Request
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from kvsi.store.paging import SessionOrder

SESSION_ID_PATTERN = r"^[\x21-\x2E\x30-\x7E]{1,256}$"
"""Printable ASCII without whitespace or '/': a '/' (even as %2F) would split the URL path."""

POD_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes object name (RFC 1123 subdomain), at most 253 characters."""

MEDIUM_PATTERN = r"^[A-Z][A-Z0-9_]{0,31}$"
"""vLLM's media (GPU, CPU, DISK, STORAGE...) and any future short uppercase word."""

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
"""Bounds one response: a router asking for "everything" gets pages, not a huge body."""

MAX_CURSOR = 512
"""Cursors the store hands out are a hash or a timestamp and id; anything longer is not one."""

RULES: dict[str, str] = {
    "session_id": "must be 1..256 printable ASCII characters without whitespace or '/'",
    "pod": "must be a Kubernetes name: 1..253 of a-z, 0-9, '-', '.', "
    "starting and ending with a letter or digit",
    "prefix": "must be 1..256 printable ASCII characters without whitespace or '/', "
    "as a session id",
    "medium": "must be an uppercase medium such as GPU, CPU, DISK or STORAGE "
    "(A-Z first, then up to 31 of A-Z, 0-9, '_')",
}
"""Human text for a pattern mismatch, by parameter name (a regex alone is a poor error)."""

PATTERN_RULES: dict[str, str] = {
    SESSION_ID_PATTERN: RULES["session_id"],
    POD_PATTERN: RULES["pod"],
    MEDIUM_PATTERN: RULES["medium"],
}
"""The same text by pattern, for a value checked by one of them under another name (a
`/v1/watch` filter, a `/v1/route` weight's medium)."""

SessionId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=256,
        pattern=SESSION_ID_PATTERN,
        description="The session id vLLM echoed on BlockStored. " + RULES["session_id"] + ".",
        examples=["sess-A"],
    ),
]

PodName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=253,
        pattern=POD_PATTERN,
        description="Pod name. " + RULES["pod"] + ".",
        examples=["vllm-0"],
    ),
]


def _pod_filter(description: str) -> Any:
    return Field(None, min_length=1, max_length=253, pattern=POD_PATTERN, description=description)


def _medium_filter() -> Any:
    return Field(
        None, pattern=MEDIUM_PATTERN, description="Only blocks on this medium (GPU, CPU, ...)."
    )


def _limit() -> Any:
    return Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="Items per page.")


def _cursor() -> Any:
    return Field(
        None,
        min_length=1,
        max_length=MAX_CURSOR,
        description="`next_cursor` of the previous page; omit for the first page.",
    )


@cache
def _accepted_names(model: type[BaseModel]) -> frozenset[str]:
    """A model's field names and the other names (validation aliases) its fields answer to."""
    names: set[str] = set(model.model_fields)
    for info in model.model_fields.values():
        alias = info.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif isinstance(alias, AliasChoices):
            names.update(choice for choice in alias.choices if isinstance(choice, str))
    return frozenset(names)


class KnownNames(BaseModel):
    """A model whose inputs are names it defines: any other is an error listing the allowed
    ones, instead of pydantic's "Extra inputs are not permitted" (which names no alternative)
    or of being ignored.

    A silently ignored typo (`?pods=vllm-0`, `"hashing": {"seed": ...}`) would answer for
    a request other than the one meant: unfiltered results a router takes for filtered ones.
    """

    model_config = ConfigDict(extra="forbid")
    unknown_name: ClassVar[str] = "field"
    """What an input of this model is called in an error ("unknown field 'x'")."""

    @model_validator(mode="before")
    @classmethod
    def _known_names_only(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            accepted = _accepted_names(cls)
            unknown = sorted(str(k) for k in data if k not in accepted)
            if unknown:
                allowed = ", ".join(sorted(cls.model_fields))
                raise ValueError(
                    f"unknown {cls.unknown_name} {', '.join(map(repr, unknown))}; "
                    f"allowed: {allowed}"
                )
        return data


class QueryParams(KnownNames):
    """Query parameters of one endpoint; a name it does not know is an error, not ignored."""

    unknown_name: ClassVar[str] = "query parameter"


class BodyModel(KnownNames):
    """A JSON request body, or an object inside one; an unknown field is an error."""


async def once_each(request: Request) -> None:
    """Dependency: a query parameter given twice is a 400. FastAPI keeps one of the values
    silently, so `?prefix=a&prefix=b` would answer for `b` as if `a` had not been asked."""
    counts = Counter(name for name, _ in request.query_params.multi_items())
    repeated = sorted(name for name, n in counts.items() if n > 1)
    if repeated:
        raise HTTPException(
            status_code=400,
            detail=f"query parameter {', '.join(map(repr, repeated))} given more than once",
        )


class SessionBlocksQuery(QueryParams):
    """Filters and paging of a session's block hashes."""

    pod: str | None = _pod_filter("Only blocks resident on this pod (all its ranks).")
    medium: str | None = _medium_filter()
    limit: int = _limit()
    cursor: str | None = _cursor()


class SessionListQuery(QueryParams):
    """Filters, order and paging of the session list."""

    pod: str | None = _pod_filter("Only sessions with blocks resident on this pod.")
    prefix: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        pattern=SESSION_ID_PATTERN,
        description="Only sessions whose id starts with this (a whole id matches itself); it "
        + RULES["prefix"]
        + ".",
        examples=["sess-00"],
    )
    order: SessionOrder = Field(
        "last_seen",
        description="`last_seen`: most recently seen first (sessions holding no blocks "
        "included). `blocks`: most resident blocks first (over `pod` if given, else the "
        "fleet), only sessions holding blocks; costs a read of every residency per page. "
        "Ties by session id. A cursor only continues the order it came from.",
    )
    limit: int = _limit()
    cursor: str | None = _cursor()


class PodBlocksQuery(QueryParams):
    """Filters and paging of a pod's block hashes."""

    dp_rank: int | None = Field(
        None, ge=0, description="Only this data-parallel rank; all ranks when omitted."
    )
    medium: str | None = _medium_filter()
    limit: int = _limit()
    cursor: str | None = _cursor()
