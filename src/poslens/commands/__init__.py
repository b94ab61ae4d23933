"""CLI commands; each module attaches its commands to :data:`poslens.cli_app.app`."""
