"""The canonical JSON spelling of a document: sorted keys, no spaces, ASCII. Equal values are
equal texts, so stored specs compare (and hash) as text."""

from __future__ import annotations

import _json
import json
from typing import Any

import orjson

# orjson spells a document as json.dumps(sort_keys=True, separators=(",", ":")) does, seven
# times faster (0.6 us a Job's spec against 4.5: a tenth of storing a job a Source received),
# but for three things. Text outside ASCII and DEL, which json escapes: such a document is
# spelled by json. A float below 1e-4 (json: 1e-05, orjson: 0.00001) and NaN or infinity
# (json: NaN, orjson: null): kept as orjson spells them, for no spec holds one (the only
# float of any kind's spec is a Job's backoff factor, 1 to 1000; tests/test_jsontext.py
# keeps it so), so no spec stored by json before reads as changed, and the models refuse NaN.
_FAST = (
    orjson.OPT_SORT_KEYS
    # what json refuses, orjson must not spell: these go to json, which raises
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
# json.dumps makes an encoder, and the encoder its C scanner, on every call: a third of the
# time of a spec's few hundred bytes. Made once here, with the same settings (and no check
# for circular references: a document read from JSON or a model's dump has none), it spells
# every value exactly as json.dumps(sort_keys=True, separators=(",", ":")) does.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
_ENCODE = _json.make_encoder(None, _CANONICAL.default, _json.encode_basestring_ascii, None, ":", ",", True, False, True)


def canonical(document: Any) -> str:
    """One spelling per value, so equal specs compare equal as text."""
    try:
        text = orjson.dumps(document, option=_FAST)
    except TypeError:  # an int beyond 64 bits, a key that is not a str, a subclass: json's
        return "".join(_ENCODE(document, 0))
    if text.isascii() and 0x7F not in text:
        return text.decode()
    return "".join(_ENCODE(document, 0))


def parse(text: str | bytes) -> Any:
    """A stored status or node document, read as json.loads reads it, three times faster (a
    Job's status of ~1.3 kB: 8 us against 22; a step reads several). What orjson refuses,
    json takes (NaN, a number beyond a double, a lone surrogate), so nothing reads otherwise,
    but for one difference: orjson reads an integer beyond 64 bits as a float. The documents
    read here hold none: a status's integers are the system's own, bounded where they are
    read (an exit record: 0-255) or received (an agent's report: wire.Int64); a Pool's or a
    Node's spec holds slot counts bounded by its model, and labels hold text. A Job's spec,
    whose integers a user chose, is read with json (and once per text)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
