"""`asyncrl schema`: the JSON Schema of run files (or hardware presets) for editors and tools."""

from __future__ import annotations

from typing import Annotated

import typer

from asyncrl_cli.config.catalog import HARDWARE_SCHEMA_FILE, RUN_SCHEMA_FILE, presets_dir
from asyncrl_cli.errors import InvalidConfig, handle_errors
from asyncrl_cli.output import stderr_console


@handle_errors
def command(
    hardware: Annotated[
        bool, typer.Option("--hardware", help="The schema of hardware presets instead.")
    ] = False,
    write: Annotated[bool, typer.Option("--write", help="Write both schemas under presets/.")] = False,
    check: Annotated[
        bool, typer.Option("--check", help="Exit 1 when the files under presets/ are stale.")
    ] = False,
) -> None:
    """Print the JSON Schema of run files (presets carry a [bold]#:schema[/] header pointing at it)."""
    from asyncrl_cli.config.jsonschema import dumps, hardware_schema, run_schema

    files = {RUN_SCHEMA_FILE: dumps(run_schema()), HARDWARE_SCHEMA_FILE: dumps(hardware_schema())}
    if write or check:
        stale = []
        for fname, text in files.items():
            path = presets_dir() / fname
            current = path.read_text(encoding="utf-8") if path.is_file() else None
            if current != text:
                stale.append(str(path))
                if write:
                    path.write_text(text, encoding="utf-8")
        con = stderr_console()
        if check and stale and not write:
            raise InvalidConfig(f"stale schema file(s): {', '.join(stale)}", "run `asyncrl schema --write`")
        con.print(f"wrote {', '.join(stale)}" if write and stale else "schema files are up to date")
        return
    typer.echo(files[HARDWARE_SCHEMA_FILE if hardware else RUN_SCHEMA_FILE], nl=False)
