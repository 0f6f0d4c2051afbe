"""Any failure as one line: what the CLI prints on stderr and what a fetch reports (`FetchResult.error`).

Job logs and termination messages are read by people and by the operator, so neither gets a traceback or
pydantic's boilerplate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def validation_error(err: Mapping[str, Any], whole: str) -> str:
    """One of pydantic's errors as `field.path: rule`, without its boilerplate; `whole` names an error of the
    whole document (an empty location)."""
    return f"{'.'.join(str(x) for x in err['loc']) or whole}: {str(err['msg']).removeprefix('Value error, ')}"


def one_line(e: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(e, ValidationError):  # the field and the rule, without pydantic's boilerplate
        return "; ".join(validation_error(err, "request") for err in e.errors())
    text = str(e) or type(e).__name__
    if isinstance(e, OSError) and e.filename and str(e.filename) not in text:
        text = f"{e.filename}: {text}"
    return " ".join(text.split())


def write_termination_message(text: str) -> None:
    """To STRATA_TERMINATION_MESSAGE_PATH, or /dev/termination-log when it exists (i.e. inside a pod), where the
    kubelet reads it into the container's status for the operator."""
    from ..contract import DEFAULT_TERMINATION_MESSAGE_PATH, ENV_TERMINATION_MESSAGE_PATH

    path = os.environ.get(ENV_TERMINATION_MESSAGE_PATH)
    if path is None:
        if not os.path.exists(DEFAULT_TERMINATION_MESSAGE_PATH):
            return
        path = DEFAULT_TERMINATION_MESSAGE_PATH
    with open(path, "w") as f:
        f.write(text)
