"""``esmjac`` command line: bands, block, assemble, check, demo."""
from __future__ import annotations

import argparse
import sys

from .errors import JacError

__all__ = ["main"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="an .esm document")
    p.add_argument("--model", default=None, help="model to differentiate (documents with several)")
    p.add_argument("--wrt", default="states", choices=["states", "parameters", "time"])
    p.add_argument("--faq", action="store_true",
                   help="spell the array op `faq` (esm >= 1.1.0) instead of the reference's `aggregate`")


def _bandset(args):
    from .bandset import BandSet
    return BandSet.build(args.file, args.model, args.wrt,
                         {"agg_spelling": "faq" if args.faq else "aggregate"})


def cmd_bands(args) -> int:
    sys.stdout.write(_bandset(args).entries_json() + "\n")
    return 0


def cmd_block(args) -> int:
    sys.stdout.write(_bandset(args).block_json() + "\n")
    return 0


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="esmjac", description="Exact analytical Jacobians for .esm models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("bands", help="print the band entries as deterministic JSON")
    _common(p)
    p.set_defaults(fn=cmd_bands)
    p = sub.add_parser("block", help="print the emitted `jacobians` block as deterministic JSON")
    _common(p)
    p.set_defaults(fn=cmd_block)
    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except JacError as exc:
        print(f"esmjac: error: {exc}", file=sys.stderr)
        return 2
