"""The argparse subparsers of ``passctl compare``, ``bisect`` and ``diff`` (:mod:`passctl.tools.compare`,
:mod:`~passctl.tools.bisect`, :mod:`~passctl.tools.diff`), apart from their modules so that
building the CLI's parser (``passctl --help``) imports neither onnx nor the pass manager."""

from __future__ import annotations


def add_compare_parser(sub) -> None:
    p = sub.add_parser("compare", help="pair every intermediate tensor of an original and a "
                       "candidate through provenance and report per-tensor errors")
    p.add_argument("original", help="the original .onnx")
    p.add_argument("candidate", nargs="?", default=None,
                   help="a model file, an artifact folder (a TVM artifact: outputs from its model.so, "
                   "intermediates from a debug build of its ir.onnx) or a --dump-ir folder (or "
                   "--pipeline)")
    p.add_argument("--pipeline", "-p", default=None, help="compile the original with this "
                   "pipeline and compare the result")
    p.add_argument("--target", "-t", default="cpu")
    p.add_argument("--inputs", metavar="FILE.npz", help="arrays by input name (default: seeded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    p.add_argument("--bound", default="max-rel=1e-4", metavar="METRIC=VALUE",
                   help="a pair is wrong above it (max-rel, mean-rel or cosine; default "
                        "max-rel=1e-4)")
    p.add_argument("--load", action="append", default=[], metavar="FILE.py")
    p.add_argument("-o", "--output", default=".", help="folder for compare.json and compare.html")


def add_bisect_parser(sub) -> None:
    p = sub.add_parser("bisect", help="find the first pass, then the first rewrite, that breaks "
                       "a numeric bound")
    p.add_argument("model")
    p.add_argument("--pipeline", "-p", required=True)
    p.add_argument("--target", "-t", default="cpu")
    p.add_argument("--inputs", metavar="FILE.npz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE")
    p.add_argument("--bound", required=True, metavar="METRIC=VALUE",
                   help="e.g. max-rel=1e-4 (max-rel, mean-rel or cosine)")
    p.add_argument("--load", action="append", default=[], metavar="FILE.py")
    p.add_argument("-o", "--output", default=None,
                   help="reproducer folder (default ./<model stem>.bisect)")


def add_diff_parser(sub) -> None:
    p = sub.add_parser("diff", help="what changed between two models, node by node, matched "
                       "through provenance")
    p.add_argument("a", help="IR text, .onnx, or a --dump-ir step")
    p.add_argument("b")
    p.add_argument("--all", action="store_true", help="also list unchanged nodes")
    p.add_argument("--json", metavar="FILE", help="write the changes as JSON")
