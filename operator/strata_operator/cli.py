"""`strata-operator`: run the operator, or write the CRDs generated from the API models."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HANDLERS_MODULE = "strata_operator.routes"


def write_crds(directory: Path) -> list[Path]:
    from strata_operator.api.kinds import all_crds, crd_file_name, render_yaml

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for crd in all_crds():
        path = directory / crd_file_name(crd)
        path.write_text(render_yaml(crd))
        written.append(path)
    return written


def kopf_run_args(args: argparse.Namespace) -> list[str]:
    """The `kopf run` command line for Strata's handlers (also used by tests that run it in-process)."""
    # Peering (kopf's leader election between replicas) needs kopf's peering CRD; a single replica runs standalone.
    argv = ["run", "-m", HANDLERS_MODULE, f"--peering={args.peering}" if args.peering else "--standalone"]
    argv += [f"--namespace={ns}" for ns in args.namespace] if args.namespace else ["--all-namespaces"]
    if args.liveness:
        argv.append(f"--liveness={args.liveness}")
    if args.verbose:
        argv.append("--verbose")
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="strata-operator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="reconcile ModelCache and KVCacheTier resources")
    run.add_argument("--namespace", "-n", action="append", default=[], help="watch only these namespaces")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="health probe endpoint")
    run.add_argument("--peering", default=None, help="kopf peering name, for more than one replica")
    run.add_argument("--verbose", action="store_true")
    crds = sub.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--output-dir", type=Path, default=Path("crds"))
    crds.add_argument("--check", action="store_true", help="fail if the files on disk differ")
    args = parser.parse_args(argv)

    if args.command == "crds":
        return crds_command(args.output_dir, check=args.check)
    import kopf.cli

    kopf.cli.main(args=kopf_run_args(args), prog_name="strata-operator", standalone_mode=False)
    return 0


def crds_command(directory: Path, *, check: bool) -> int:
    from strata_operator.api.kinds import all_crds, crd_file_name, render_yaml

    if not check:
        for path in write_crds(directory):
            print(f"wrote {path}")
        return 0
    stale = []
    for crd in all_crds():
        path = directory / crd_file_name(crd)
        if not path.exists() or path.read_text() != render_yaml(crd):
            stale.append(str(path))
    if stale:
        print(f"CRDs out of date: {', '.join(stale)}; run `make crds` and commit", file=sys.stderr)
        return 1
    print("CRDs up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
