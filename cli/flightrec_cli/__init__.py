"""The `flightrec` command line: a thin Typer layer over the flightrec library."""
