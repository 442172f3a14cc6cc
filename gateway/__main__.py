"""``python -m gateway``: the ``specroute`` command."""

import os
import threading
import time


def _exit_with_parent() -> None:
    """Processes started by tests and ``specroute demo`` stop when their parent dies."""
    parent = int(os.environ.get("SPECROUTE_PARENT_PID", "0"))
    if not parent:
        return

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


_exit_with_parent()

from gateway.cli import main  # noqa: E402

main()
