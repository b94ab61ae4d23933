"""Entry point of the ``poslens`` command: options -> config dataclass -> library call."""

from __future__ import annotations

import sys

from poslens.runtime import configure_process

configure_process()  # before anything imports torch: OpenMP threads sleep instead of spinning while they wait

from poslens.cli.app import app  # noqa: E402
from poslens.errors import PoslensError  # noqa: E402

# Each import attaches its commands to `app` (one module per capability).
from poslens.cli import theory as _theory  # noqa: F401,E402
from poslens.cli import scan as _scan  # noqa: F401,E402
from poslens.cli import train as _train  # noqa: F401,E402
from poslens.cli import simulate as _simulate  # noqa: F401,E402
from poslens.cli import reproduce as _reproduce  # noqa: F401,E402
from poslens.cli import demo as _demo  # noqa: F401,E402
from poslens.cli import report as _report  # noqa: F401,E402
from poslens.cli import neighborhood as _neighborhood  # noqa: F401,E402
from poslens.cli import kim_slash as _kim_slash  # noqa: F401,E402
from poslens.cli import models as _models  # noqa: F401,E402


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; a :class:`PoslensError` becomes one line on stderr and exit code 2."""
    import signal

    # SIGTERM (a killed job, a scheduler's timeout) becomes a normal exit, so `finally` blocks
    # run: staging directories are removed and checkpoints stay consistent.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        app(args=argv, standalone_mode=True)
    except PoslensError as e:
        print(f"poslens: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
