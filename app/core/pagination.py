"""Keyset pagination of the list endpoints.

Every list is read a page at a time (``limit``, 1 to 1000, default 100) in a stable
order by a unique key, and the next page starts strictly past the last item of this
one, named by its id: ``before_id`` for the audit log (newest first, as it always was),
``after_id`` for every other list (oldest first, as they always were; so a client that
reads a small collection in one call gets the same list as before). Keysets, not
offsets: a page costs the same however deep it is, and items added meanwhile neither
shift nor repeat the pages still to come.

A page is read with one row more than ``limit``; that row is never returned, it only
tells whether another page exists. Lists whose items carry declared JSON of their own (a
dataset's columns, a release's columns and parameters: up to about a MiB each) also end a
page once its items weigh :data:`MAX_PAGE_BYTES` (``weigh``: their JSON's length), rows
read a few at a time: a page of 100 datasets declared with 1 MiB of categories each took
12 s and 1 GB of the API's memory, and a page of 1000 would have taken about 10 GB.
While another page exists the response carries an RFC 8288 header
``Link: <url of the next page>; rel="next"``, and the last page has none. The bodies
are unchanged (a bare list stays a bare list), so existing clients keep working.

Lists ordered by time (``created_at``, then the id to break ties) find the cursor's
position by reading that item *within the caller's own list* (the same query, the same
access rules): an id that is not in it (unknown, another dataset's, invisible to the
caller, or a grant revoked since) is one and the same 422, which tells nothing about
items the caller cannot see. Lists ordered by an integer id (the audit log, the ledger)
need no lookup: any id is a bound, as ``before_id`` always was for the audit log.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

from fastapi import Query, Request, Response
from sqlalchemy import Select, literal, tuple_
from sqlalchemy.orm import InstrumentedAttribute, Session

from app.core.errors import InvalidRequest

T = TypeVar("T")
U = TypeVar("U")

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: The JSON a page of weighed items (``by_time``'s ``weigh``) holds before it ends early
#: (it holds at least one item, however heavy): the page's cost in the API process,
#: about 10 times this in memory while its items are validated and rendered.
MAX_PAGE_BYTES = 8 << 20
#: Rows fetched from the database at once while a weighed page is read.
WEIGHED_FETCH_ROWS = 16
#: The largest id a 64-bit key holds (the audit log's and the ledger's).
MAX_INT_ID = 2**63 - 1

Limit = Annotated[
    int,
    Query(ge=1, le=MAX_LIMIT, description="items per page (1 to 1000)"),
]
AfterId = Annotated[
    uuid.UUID | None,
    Query(
        description="the id of the last item of the previous page: this page starts "
        'after it (the Link header\'s rel="next" URL sets it)'
    ),
]
AfterIntId = Annotated[
    int | None,
    Query(
        ge=1,
        le=MAX_INT_ID,
        description="the id of the last item of the previous page: this page starts "
        'after it (the Link header\'s rel="next" URL sets it)',
    ),
]

#: OpenAPI ``responses=`` entry of a paged list: the ``Link`` header of its 200.
NEXT_LINK: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "one page of the list",
        "headers": {
            "Link": {
                "description": 'RFC 8288 `<url>; rel="next"`: the URL of the next page; '
                "absent on the last page",
                "schema": {"type": "string"},
            }
        },
    }
}


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list and the cursor of the next page (``None``: this is the last)."""

    items: list[T]
    next_cursor: uuid.UUID | int | None

    def map(self, convert: Callable[[T], U]) -> Page[U]:
        return Page([convert(item) for item in self.items], self.next_cursor)


def json_size(*values: Any) -> int:
    """The length of ``values`` written as compact JSON: an item's weight for a page."""
    return sum(len(json.dumps(value, separators=(",", ":"), default=str)) for value in values)


def _cut(rows: list[T], limit: int, key: Callable[[T], uuid.UUID | int]) -> Page[T]:
    """The first ``limit`` of ``limit + 1`` rows, and the next cursor if the extra row
    exists."""
    if len(rows) > limit:
        return Page(rows[:limit], key(rows[limit - 1]))
    return Page(rows, None)


def by_time(
    session: Session,
    stmt: Select[Any],
    created_at: InstrumentedAttribute[Any],
    key: InstrumentedAttribute[uuid.UUID],
    limit: int,
    after: uuid.UUID | None,
    key_of: Callable[[T], uuid.UUID],
    weigh: Callable[[T], int] | None = None,
) -> Page[T]:
    """A page of ``stmt`` (one entity, already filtered to what the caller may see),
    oldest first by ``(created_at, key)``, starting past the item whose key is ``after``.
    With ``weigh`` the page also ends once its items weigh :data:`MAX_PAGE_BYTES` (at
    least one item), its rows read a few at a time, not all ``limit`` at once.

    ``after`` is looked up with ``stmt`` itself, so an id outside the caller's list is a
    422 whatever the reason (see the module docstring)."""
    if after is not None:
        position = session.execute(
            stmt.with_only_columns(created_at, key).where(key == after)
        ).first()
        if position is None:
            raise InvalidRequest(
                f"after_id {after} is not an item of this list (an id from an earlier "
                "page of this very list, whose item is still in it); list again from "
                "the start"
            )
        stmt = stmt.where(
            tuple_(created_at, key)
            > tuple_(literal(position[0], created_at.type), literal(position[1], key.type))
        )
    ordered = stmt.order_by(created_at, key).limit(limit + 1)
    if weigh is None:
        rows: list[T] = list(session.scalars(ordered))
        return _cut(rows, limit, key_of)
    result = session.scalars(ordered.execution_options(yield_per=WEIGHED_FETCH_ROWS))
    try:
        return _weighed(result, limit, key_of, weigh)
    finally:
        result.close()  # the rows past the page are not read


def _weighed(
    result: Iterable[T], limit: int, key_of: Callable[[T], uuid.UUID], weigh: Callable[[T], int]
) -> Page[T]:
    """The rows of ``result`` up to ``limit`` or until they weigh :data:`MAX_PAGE_BYTES`;
    a row read past them is not kept, and says that another page follows."""
    rows: list[T] = []
    weight = 0
    for row in result:
        if len(rows) == limit or weight >= MAX_PAGE_BYTES:
            return Page(rows, key_of(rows[-1]))
        rows.append(row)
        weight += weigh(row)
    return Page(rows, None)


def by_id(
    session: Session,
    stmt: Select[Any],
    key: InstrumentedAttribute[int],
    limit: int,
    bound: int | None,
    key_of: Callable[[T], int],
    *,
    newest_first: bool = False,
) -> Page[T]:
    """A page of ``stmt`` ordered by its integer ``key``: ascending past ``bound``, or
    with ``newest_first`` descending below it (the audit log's ``before_id``)."""
    if bound is not None:
        stmt = stmt.where(key < bound if newest_first else key > bound)
    order = key.desc() if newest_first else key
    rows: list[T] = list(session.scalars(stmt.order_by(order).limit(limit + 1)))
    return _cut(rows, limit, key_of)


def link_next(request: Request, response: Response, param: str, page: Page[Any]) -> None:
    """Announce the next page, if any, in a ``Link`` header: this request's URL with the
    cursor ``param`` set to the page's next cursor (``limit`` and the rest kept)."""
    if page.next_cursor is not None:
        url = request.url.include_query_params(**{param: str(page.next_cursor)})
        response.headers["Link"] = f'<{url}>; rel="next"'
