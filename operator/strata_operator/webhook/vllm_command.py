"""Recognising a container that runs vLLM, and the flags Strata adds to its command line.

A labelled pod should need nothing but its labels: a vLLM container gets the model path and `--load-format strata`
(and, with a tier, the KV transfer flags) at admission. Only containers whose command and args run vLLM are
touched (`vllm serve ...`, `python -m vllm.entrypoints.openai.api_server ...`); a sidecar is left alone. Pure
functions on plain dicts, so every command form is unit-tested without a cluster.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from typing import Any

VLLM_MODULES = frozenset({"vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"})
"""Modules `python -m` runs vLLM's OpenAI server from."""
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
GPU_RESOURCE = "nvidia.com/gpu"
MODEL_FLAG = "--model"
LOAD_FORMAT_FLAG = "--load-format"
LOAD_FORMAT_VALUE = "strata"


def command_words(container: Mapping[str, Any]) -> list[str]:
    """The container's command then args, as strings: how vLLM's command line is read."""
    return [str(w) for w in (container.get("command") or [])] + [str(w) for w in (container.get("args") or [])]


def vllm_form(container: Mapping[str, Any]) -> str | None:
    """`serve` (`vllm serve`, whose model is positional), `module` (`python -m <vLLM server>`), or None: not vLLM.

    Decided from command+args together (an image's entrypoint is not in the pod, so a container that sets only
    args is recognised when its args start the same way)."""
    words = command_words(container)
    for i, word in enumerate(words[:3]):
        base = posixpath.basename(word)
        if base == "vllm" and i + 1 < len(words) and words[i + 1] == "serve":
            return "serve"
        module = words[i + 2] if _PYTHON.match(base) and words[i + 1 : i + 2] == ["-m"] and i + 2 < len(words) else ""
        if module in VLLM_MODULES:  # cli.main is the `vllm` command itself: `serve` follows it
            return "serve" if words[i + 3 : i + 4] == ["serve"] else "module"
    return None


def flag_value(container: Mapping[str, Any], flag: str) -> tuple[bool, str | None]:
    """Whether command+args pass `flag` (as `flag v` or `flag=v`), and its value."""
    words = command_words(container)
    for i, word in enumerate(words):
        if word == flag:
            return True, words[i + 1] if i + 1 < len(words) else None
        if word.startswith(f"{flag}="):
            return True, word.split("=", 1)[1]
    return False, None


def serve_positional(container: Mapping[str, Any]) -> tuple[int, str | None] | None:
    """For `vllm serve`: (index in args where the positional model is or belongs, the model given or None).
    None when `serve` is in neither list (not that form)."""
    command = [str(w) for w in container.get("command") or []]
    args = [str(w) for w in container.get("args") or []]
    if "serve" in command:
        at = 0
    elif "serve" in args:
        at = args.index("serve") + 1
    else:
        return None
    given = args[at] if at < len(args) and not args[at].startswith("-") else None
    return at, given


def requests_gpu(container: Mapping[str, Any]) -> bool:
    """The container asks for an NVIDIA GPU (requests or limits; the device plugin needs one of them)."""
    resources = container.get("resources") or {}
    return any(
        str((resources.get(part) or {}).get(GPU_RESOURCE, "0")) not in ("0", "") for part in ("requests", "limits")
    )


def engine_python(container: Mapping[str, Any]) -> str:
    """The interpreter that runs vLLM in the container: the one its command names (`python3.12 -m vllm...`, or
    beside the `vllm` script it starts: `/opt/venv/bin/vllm serve` → `/opt/venv/bin/python3`), else the image's
    `python3` on PATH."""
    words = command_words(container)
    for i, word in enumerate(words[:3]):
        base = posixpath.basename(word)
        if _PYTHON.match(base) and words[i + 1 : i + 2] == ["-m"]:
            return word
        if base == "vllm" and words[i + 1 : i + 2] == ["serve"]:
            return posixpath.join(posixpath.dirname(word), "python3") if "/" in word else "python3"
    return "python3"
