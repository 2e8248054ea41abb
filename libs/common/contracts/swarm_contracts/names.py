"""Names are labels, not paths: the one rule for every name and label a user gives Swarm.

Two kinds, one module shared by the gateway, the registry and the CLI:

* **names** of models, adapters, aliases, promotion rules and tenants become NATS subject
  tokens, KV keys and store-key segments, so they are one lowercase token:
  ``NAME_PATTERN`` (``[a-z0-9][a-z0-9_-]``, 1 to ``NAME_MAX`` characters). Nothing is
  normalised: a name that breaks the rule is refused, naming the rule.
* **labels** (a dataset's display name, a metric a rule compares) are free text that is only
  ever shown: printable Unicode, no control characters, no path separators, not ``.``/``..``,
  at most ``LABEL_MAX`` characters. An uploaded file's name becomes a label by keeping its last
  path component (``../../tmp/x.jsonl`` -> ``x.jsonl``): browsers and curl send a path there.

``check_name``/``check_label`` raise ``ValueError`` with a message fit for a 4xx (the caller
names the field); ``Name`` and ``Label`` are the same rules as pydantic field types.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated

from pydantic import AfterValidator, Field

NAME_MAX = 63
# Names end up inside NATS subjects and store keys: one token, no dots or wildcards.
NAME_PATTERN = rf"^[a-z0-9][a-z0-9_-]{{0,{NAME_MAX - 1}}}$"
LABEL_MAX = 200
# A metric name a promotion rule compares (``eval_loss``, ``eval/accuracy``...): shown and
# used as a dict key, never as a path.
METRIC_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$"

# A Hugging Face Hub repo id (``org/name`` or ``name``) a base model was registered from: only
# ever written into ``adapter_config.json`` as a reference, never used as a path.
HF_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}(/[A-Za-z0-9][A-Za-z0-9_.-]{0,95})?$"

_NAME = re.compile(NAME_PATTERN)
_SEPARATORS = ("/", "\\")


def _shown(value: str) -> str:
    # The offending value in a message, cut short and with control characters escaped.
    text = value if len(value) <= 80 else value[:77] + "..."
    return ascii(text) if any(not c.isprintable() for c in text) else repr(text)


def check_name(value: str, what: str = "name") -> str:
    """``value`` if it is a valid name; ``ValueError`` saying which rule it breaks."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > NAME_MAX:
        raise ValueError(f"{what} is {len(value)} characters long; at most {NAME_MAX}")
    if not _NAME.match(value):
        raise ValueError(
            f"{what} {_shown(value)} is not a name: lowercase letters, digits, '-' and '_', "
            f"starting with a letter or digit (no '/', '.', spaces or control characters)"
        )
    return value


def check_label(value: str, what: str = "label") -> str:
    """``value`` if it is a valid label; ``ValueError`` saying which rule it breaks."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must not be empty")
    if len(value) > LABEL_MAX:
        raise ValueError(f"{what} is {len(value)} characters long; at most {LABEL_MAX}")
    if "\ufffd" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError(f"{what} {_shown(value)} is not valid UTF-8 text")
    for c in value:
        # Cc: control characters (NUL, newline, ESC...); Cf: invisible format characters
        # (bidi overrides) that make a label display as something it is not.
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn"):
            raise ValueError(f"{what} {_shown(value)} contains a control character")
    if any(sep in value for sep in _SEPARATORS) or value.strip() in (".", ".."):
        raise ValueError(f"{what} {_shown(value)} is a path; a label has no '/' or '\\'")
    return value


def label_from_filename(filename: str, what: str = "file name") -> str:
    """The label an uploaded file's name gives: its last path component, checked."""
    base = re.split(r"[/\\]", filename)[-1]
    if base in ("", ".", ".."):
        raise ValueError(f"{what} {_shown(filename)} names no file")
    return check_label(base, what)


Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=NAME_MAX)]
Label = Annotated[str, Field(max_length=LABEL_MAX), AfterValidator(check_label)]
