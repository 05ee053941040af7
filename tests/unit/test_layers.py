"""The import graph of reward_server/ and trainer/, read from the source (every import
statement, those inside functions too): no cycles, and each layer imports only the ones below.

Layers, top to bottom: entry points (cli, app with compose and service_deployment, eval) >
config > transport (rpc) > orchestration (the service package, then the reward kinds it
dispatches through) > hosting (serving) > science (rubric, nli) > engines (backends) > shared
leaves (domain, errors, numerics, components, metrics, cooperative). Beside them: the api (the
client-safe face of reward.v1: codec, kind facts, row contract; on the leaves only, below the
transport and the kinds, which import it), the client (on the api), the framework integrations
(on the client), and the trainer, which sees only reward_server's public faces.

No exception: every edge of the graph is checked, a module's edges to its own package's
``__init__`` included.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("reward_server", "trainer")

# module prefix -> prefixes of reward_server modules it must NOT import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "reward_server.backends": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.service", "reward_server.serving",
        "reward_server.rubric", "reward_server.nli", "reward_server.client",
    ),
    "reward_server.rubric": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.service", "reward_server.serving",
        "reward_server.client", "reward_server.nli",
    ),
    "reward_server.nli": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.service", "reward_server.serving",
        "reward_server.client", "reward_server.rubric",
    ),
    "reward_server.serving": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.service", "reward_server.client",
    ),
    "reward_server.service": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.client",
    ),
    # a kind knows its science and the engines' protocols; the service dispatches through it,
    # and the transport converts its proto message (keyed by domain.RewardKind), so neither
    # the service, the hosting nor the transport is below it
    "reward_server.kinds": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.rpc", "reward_server.client", "reward_server.service",
        "reward_server.serving",
    ),
    # the transport: the client and the framework integrations sit beside it, on the api
    "reward_server.rpc": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.serving", "reward_server.client", "reward_server.integrations",
    ),
    "reward_server.config": ("reward_server.app", "reward_server.cli", "reward_server.eval"),
    # the client converts with the api: never the transport, the service or anything below
    "reward_server.client": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.service",
        "reward_server.serving", "reward_server.backends", "reward_server.rubric",
        "reward_server.nli", "reward_server.rpc", "reward_server.integrations",
    ),
    # the framework integrations sit on the client, like any user's training script
    "reward_server.integrations": (
        "reward_server.config", "reward_server.app", "reward_server.cli", "reward_server.eval",
        "reward_server.service", "reward_server.serving", "reward_server.backends",
        "reward_server.rubric", "reward_server.nli", "reward_server.rpc", "trainer",
    ),
    "reward_server.domain": ("reward_server.",),
    "reward_server.errors": ("reward_server.",),
    "reward_server.numerics": ("reward_server.",),
    "reward_server.metrics": ("reward_server.",),
    "reward_server.cooperative": ("reward_server.",),
    "reward_server.client.channel": ("reward_server.",),  # the client's channel policy: grpc only
}
# the api: the leaves it may import, and the generated messages; nothing else of reward_server
API_MAY_IMPORT = ("reward_server.domain", "reward_server.components", "reward_server.errors",
                  "reward_server.cooperative", "reward_server._proto")


def _top_level() -> set[str]:
    """reward_server's top-level modules and packages (``reward_server.rpc``, ...)."""
    out = {f"reward_server.{p.stem}" for p in (ROOT / "reward_server").glob("*.py")
           if p.stem != "__init__"}
    return out | {f"reward_server.{p.name}" for p in (ROOT / "reward_server").iterdir()
                  if (p / "__init__.py").is_file()}


# components: the one leaf on another (it names the domain's kinds and regimes)
FORBIDDEN["reward_server.components"] = tuple(sorted(
    _top_level() - {"reward_server.domain", "reward_server.components"}))
FORBIDDEN["reward_server.api"] = (*sorted(
    _top_level() - set(API_MAY_IMPORT) - {"reward_server.api"}), "trainer")


# the composition modules sit with app at the top: nothing below imports them
for _layer, _forbidden in FORBIDDEN.items():
    if "reward_server.app" in _forbidden:
        FORBIDDEN[_layer] += ("reward_server.compose", "reward_server.service_deployment")

# the layers below the kinds, and the client side, never import them
for _layer in ("reward_server.backends", "reward_server.rubric", "reward_server.nli",
               "reward_server.serving", "reward_server.client", "reward_server.integrations"):
    FORBIDDEN[_layer] += ("reward_server.kinds",)

# what the trainer may import of reward_server: its public faces, and the package itself (its
# version)
PUBLIC_FACES = ("reward_server.api", "reward_server.client", "reward_server.integrations",
                "reward_server.domain", "reward_server.components", "reward_server.config",
                "reward_server.prompts")


def modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def imports(source: str, package: str, known: dict[str, Path]) -> Iterator[str]:
    """Every module ``source`` imports, relative imports resolved against ``package`` (that of
    the module, or the package itself for its ``__init__``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = (node.module or "") if node.level == 0 else ".".join(
                p for p in (base, node.module) if p)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                yield full if full in known else module


def graph() -> dict[str, set[str]]:
    known = modules()
    g: dict[str, set[str]] = {}
    for name, path in known.items():
        deps = set()
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for target in imports(path.read_text(encoding="utf-8"), package, known):
            if target in known and target != name:
                deps.add(target)
        g[name] = deps
    return g


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def violations(g: dict[str, set[str]]) -> list[str]:
    """The edges of ``g`` that :data:`FORBIDDEN` forbids."""
    bad = []
    for name, deps in g.items():
        for layer, forbidden in FORBIDDEN.items():
            if name == layer or name.startswith(layer + "."):
                bad += [f"{name} -> {d}" for d in sorted(deps)
                        if any(d == f or d.startswith(f if f.endswith(".") else f + ".") for f in forbidden)
                        and not (d == layer or d.startswith(layer + "."))]
    return bad


def test_each_layer_imports_only_those_below() -> None:
    assert violations(graph()) == []


def test_the_installable_package_never_imports_the_trainer() -> None:
    g = graph()
    bad = sorted(f"{n} -> {d}" for n, deps in g.items() if n.startswith("reward_server")
                 for d in deps if d == "trainer" or d.startswith("trainer."))
    assert bad == []


def test_the_trainer_imports_only_the_public_faces() -> None:
    g = graph()
    outside = sorted(f"{n} -> {d}" for n, deps in g.items() if n == "trainer" or n.startswith("trainer.")
                     for d in deps if d.startswith("reward_server") and d != "reward_server"
                     and not any(d == f or d.startswith(f + ".") for f in PUBLIC_FACES))
    assert outside == []


def test_the_checker_sees_cycles_and_violations() -> None:
    """The checker itself: a made-up graph with a cycle and an upward import."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert violations({  # the loop this test once allowed, and the api reaching up
        "reward_server.rpc.openrlhf": {"reward_server.integrations.verl", "reward_server.api.rows"},
        "reward_server.api.rows": {"reward_server.rpc.jsonlimits", "reward_server.domain"},
        "reward_server.client.client": {"reward_server.rpc.status"},
    }) == ["reward_server.rpc.openrlhf -> reward_server.integrations.verl",
           "reward_server.api.rows -> reward_server.rpc.jsonlimits",
           "reward_server.client.client -> reward_server.rpc.status"]
    g = graph()
    assert "reward_server.config" in g["reward_server.app"]  # it does read edges
    assert "reward_server.serving._private.runtime" in g["reward_server.serving.start"]  # deferred
    relative = "from . import status\nfrom ..api import wire\nfrom .server import create_server\n"
    assert list(imports(relative, "reward_server.rpc", modules())) == [
        "reward_server.rpc.status", "reward_server.api.wire", "reward_server.rpc.server"]
