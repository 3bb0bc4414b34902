"""Record the parts of SGLang's API the rollout adapter calls, from SGLang's own source (no import: it needs CUDA):
``python tests/rollout/sglang_api/extract.py <sglang package dir> <version>`` writes ``sglang_<version>.json``
beside this file -- the ``Engine`` methods' signatures (as source text), the ``ServerArgs`` fields and the
``SamplingParams`` fields. tests/rollout/test_sglang_rollout.py builds a stand-in Engine from these signatures and
checks every call and keyword the adapter makes against them. Recorded: 0.5.23 (newest) and 0.5.6 (verl's pin),
from the PyPI wheels."""

import ast
import json
import sys
from pathlib import Path

METHODS = ("__init__", "generate", "update_weights_from_tensor", "release_memory_occupation",
           "resume_memory_occupation", "flush_cache", "begin_weight_update", "end_weight_update", "shutdown")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _literal_defaults(args: ast.arguments) -> ast.arguments:
    """Defaults that are not literals (SGLang constants) become None: only the names and kinds matter here."""
    def fix(d):
        if d is None:
            return None
        try:
            ast.literal_eval(d)
            return d
        except ValueError:
            return ast.Constant(None)
    args.defaults = [fix(d) for d in args.defaults]
    args.kw_defaults = [fix(d) for d in args.kw_defaults]
    for a in args.args + args.kwonlyargs + [x for x in (args.vararg, args.kwarg) if x]:
        a.annotation = None
    return args


def fields(cls: ast.ClassDef) -> list[str]:
    out = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if not out and init is not None:  # a plain class: its __init__ parameters
        out = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
    return out


def main(src: str, version: str) -> None:
    root = Path(src)
    engine = _class(ast.parse((root / "srt/entrypoints/engine.py").read_text()), "Engine")
    methods = {}
    for node in engine.body:
        if isinstance(node, ast.FunctionDef) and node.name in METHODS:
            methods[node.name] = ast.unparse(_literal_defaults(node.args))
    server_fields = fields(_class(ast.parse((root / "srt/server_args.py").read_text()), "ServerArgs"))
    if not server_fields:  # 0.5.2x: ServerArgs is assembled from the field namespaces of arg_groups/fields/
        for f in sorted((root / "srt/arg_groups/fields").glob("*.py")):
            for cls in (n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef)):
                server_fields += fields(cls)
    sampling = _class(ast.parse((root / "srt/sampling/sampling_params.py").read_text()), "SamplingParams")
    out = {"version": version, "engine_methods": methods, "server_args": sorted(set(server_fields)),
           "sampling_params": fields(sampling)}
    (Path(__file__).parent / f"sglang_{version}.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
