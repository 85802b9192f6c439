"""One module per verb; each exposes ``command`` (a click.Command)."""
