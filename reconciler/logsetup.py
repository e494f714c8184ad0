"""The log of a long-running command (`controller`, `serve`, `agent`): one format on stderr,
set up in one place, so that what it keeps out is kept out of all three."""

from __future__ import annotations

import logging
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def process_log(*, verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr, format=FORMAT)
    # httpx says each request at INFO with its URL whole: a webhook's or a queue's password
    # would be in the log, and an HTTP Source's polls (two a second) would drown what matters
    logging.getLogger("httpx").setLevel(logging.WARNING)
