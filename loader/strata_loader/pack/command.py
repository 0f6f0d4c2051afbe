"""`strata-loader pack SRC [--to REGISTRY/REPO:TAG]`: the arguments and the handler the loader's CLI registers.

Without `--to` it only prints the digests (a dry run that still reads every file). The password comes from
stdin (`--password-stdin`) or `STRATA_REGISTRY_PASSWORD`, never from an argument other processes can read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from strata_units import parse_bytes

from . import DEFAULT_PREFIX, PackError, Reference, RegistryClient, pack, push_image
from .image import DEFAULT_PLATFORMS

ENV_PASSWORD = "STRATA_REGISTRY_PASSWORD"


def add_pack(sub: Any) -> None:
    p = sub.add_parser(
        "pack",
        help="pack a model directory as an OCI image (mountable as an image volume) and push it to a registry",
    )
    p.add_argument("src", help="the model directory (or a directory `fetch` completed)")
    p.add_argument("--to", metavar="REGISTRY/REPO:TAG", help="push there (oci:// accepted); without it, a dry run")
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="the directory in the image that holds the files")
    p.add_argument(
        "--layer-threshold",
        default="1Mi",
        help="files larger than this get a layer of their own (default 1Mi)",
    )
    p.add_argument(
        "--platform",
        action="append",
        help=f"os/arch a node may mount it on; repeat for several (default {' and '.join(DEFAULT_PLATFORMS)})",
    )
    p.add_argument("--annotation", action="append", default=[], metavar="KEY=VALUE", help="on the manifests")
    p.add_argument("--created", help="RFC 3339 time recorded in the image (left out by default: digests stay put)")
    p.add_argument("--concurrency", type=int, default=4, help="layers hashed at once")
    p.add_argument("--plain-http", action="store_true", help="talk HTTP, not HTTPS, to the registry")
    p.add_argument("--ca-file", type=Path, help="CA bundle that signed the registry's certificate")
    p.add_argument("--username", help="registry user (the password from --password-stdin or $" + ENV_PASSWORD + ")")
    p.add_argument("--password-stdin", action="store_true", help="read the registry password from stdin")
    p.set_defaults(handler=run_pack)


def run_pack(args: argparse.Namespace) -> int:
    reference = Reference.parse(args.to) if args.to else None
    annotations = dict(_key_value(a) for a in args.annotation)
    image = pack(
        Path(args.src),
        prefix=args.prefix,
        threshold=parse_bytes(args.layer_threshold, minimum=0),
        platforms=tuple(args.platform or DEFAULT_PLATFORMS),
        annotations=annotations,
        created=args.created,
        concurrency=args.concurrency,
    )
    summary: dict[str, Any] = {
        "event": "packed",
        "digest": image.digest,
        "layers": [{"digest": p.digest, "size": p.size, "files": len(p.layer.files)} for p in image.layers],
        "bytes": image.layer_bytes,
    }
    if reference is not None:
        password = _password(args)
        with RegistryClient(
            reference.registry,
            plain_http=args.plain_http,
            ca_file=args.ca_file,
            username=args.username,
            password=password,
        ) as client:
            result = push_image(image, reference, client)
        summary.update(
            event="pushed",
            reference=result.reference,
            uploaded={"blobs": len(result.uploaded), "bytes": result.uploaded_bytes},
            present={"blobs": len(result.present)},
        )
    print(json.dumps(summary), flush=True)
    return 0


def _key_value(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise PackError(f"--annotation {text!r}: expected KEY=VALUE")
    return key, value


def _password(args: argparse.Namespace) -> str | None:
    if args.password_stdin:
        return sys.stdin.readline().rstrip("\r\n")
    if args.username is not None:
        password = os.environ.get(ENV_PASSWORD)
        if password is None:
            raise PackError(f"--username needs a password: --password-stdin or ${ENV_PASSWORD}")
        return password
    return None
