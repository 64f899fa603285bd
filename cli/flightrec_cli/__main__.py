"""`python -m flightrec_cli` runs the `flightrec` command."""

from flightrec_cli.app import main

main()
