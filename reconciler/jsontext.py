"""The canonical JSON spelling of a document: sorted keys, no spaces, ASCII. Equal values are
equal texts, so stored specs compare (and hash) as text."""

from __future__ import annotations

import _json
import json
from typing import Any

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
# json.dumps makes an encoder, and the encoder its C scanner, on every call: a third of the
# time of a spec's few hundred bytes. Made once here, with the same settings (and no check
# for circular references: a document read from JSON or a model's dump has none), it spells
# every value exactly as json.dumps(sort_keys=True, separators=(",", ":")) does.
_ENCODE = _json.make_encoder(None, _CANONICAL.default, _json.encode_basestring_ascii, None, ":", ",", True, False, True)


def canonical(document: Any) -> str:
    """One spelling per value, so equal specs compare equal as text."""
    return "".join(_ENCODE(document, 0))
