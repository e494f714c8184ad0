"""Compiles tables.py (SQLModel) to the DDL text of ddl.py, for each dialect.

tables.py is the schema; ddl.py is what a store runs to create it, so that creating a store
does not import SQLAlchemy and SQLModel (about half of `up`'s fixed cost on a fresh store).
tests/test_store.py holds ddl.py to what this compiles, so the two cannot drift. After
changing tables.py: `.venv/bin/python -m reconciler.store.ddlgen && .venv/bin/ruff format
reconciler/store/ddl.py`."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from sqlalchemy import create_mock_engine
from sqlmodel import SQLModel

from . import tables  # noqa: F401  (registers the tables on SQLModel.metadata)

DIALECT_URLS = {"sqlite": "sqlite://", "postgresql": "postgresql+psycopg://"}


def one_line(sql: str) -> str:
    """A statement with its whitespace collapsed: the compiled text's newlines and tabs say
    nothing to the database (the schema has no string literal holding whitespace)."""
    return " ".join(sql.split())


def compile_ddl() -> dict[str, dict[str, tuple[str, ...]]]:
    """Per dialect, per table in create_all's order: the statements create_all sends for it
    (CREATE TABLE, then its indexes, sorted: create_all's order of a table's indexes varies
    from run to run), without existence checks."""
    return {dialect: _compiled(url) for dialect, url in DIALECT_URLS.items()}


def _compiled(url: str) -> dict[str, tuple[str, ...]]:
    per_table: dict[str, list[str]] = {}

    def run(ddl: Any, *_: Any, **__: Any) -> None:
        element = ddl.element
        table = getattr(element, "table", None)
        name = element.name if table is None else table.name
        per_table.setdefault(name, []).append(one_line(str(ddl.compile(dialect=engine.dialect))))

    engine = create_mock_engine(url, run)
    SQLModel.metadata.create_all(engine, checkfirst=False)
    return {name: (create, *sorted(indexes)) for name, (create, *indexes) in per_table.items()}


def _literal(sql: str) -> str:
    """A statement as Python source within the line length: adjacent string literals."""
    pieces = textwrap.wrap(sql, 96, break_long_words=False, break_on_hyphens=False, drop_whitespace=False)
    return "\n".join(f"                {piece!r}" for piece in pieces)


def _item(sql: str) -> str:
    if len(sql) <= 96:
        return f"            {sql!r},"
    return f"            (\n{_literal(sql)}\n            ),"


def render(ddl: dict[str, dict[str, tuple[str, ...]]]) -> str:
    lines = [
        '"""GENERATED from tables.py by ddlgen.py (`python -m reconciler.store.ddlgen`): the',
        "statements that create each table and its indexes, per dialect, in create_all's order.",
        'Do not edit: tests/test_store.py fails when this differs from what tables.py compiles to."""',
        "",
        "DDL: dict[str, dict[str, tuple[str, ...]]] = {",
    ]
    for dialect, per_table in ddl.items():
        lines.append(f"    {dialect!r}: {{")
        for name, statements in per_table.items():
            lines.append(f"        {name!r}: (")
            lines += [_item(sql) for sql in statements]
            lines.append("        ),")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> None:
    target = Path(__file__).with_name("ddl.py")
    target.write_text(render(compile_ddl()))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
