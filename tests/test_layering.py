"""The layers import downward only. Every import of ours is read from the source (AST), those inside
functions included, since a function-level import is still a dependency; only `if TYPE_CHECKING:`
blocks are left out, as they never run.

    memory_store/, kernels/   import nothing of ours outside themselves
    rl/                       memory_store/, kernels/ and itself; never engine/ or bench/; the
                              task (rl/task/) builds on the rest of rl/, which never imports it
    engine/                   its folders in the order engine/__init__.py declares (bottom up), each
                              importing only the folders below it, never engine's top files
    bench/                    imported by nothing of the package
and no import cycle anywhere. One name per file across the package's layers: a module's file name
is nowhere else in memory_store/, kernels/, rl/ or engine/, except the per-package conventions
(`config.py`, `errors.py`); bench/ names each file after what it measures, so it is left out. engine's command modules (those engine/cli.py's HANDLERS name: train,
evaluate, rollout, rollout_report) are imported by nothing of ours: cli.py reaches each by name, and
what two commands share lives below them (assembly.py, the folders), so commands stay siblings.
"""
import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("memory_store", "kernels", "rl", "engine", "bench")
# The torch-free config modules of engine's folders, which config/run.py composes whatever their folder
# (engine/__init__.py says so).
CONFIG_MODULES = {"memr1.engine.generation.config", "memr1.engine.training.config", "memr1.engine.checkpoints.files",
                  "memr1.engine.observe.profiling"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["memr1", *parts])


def our_modules() -> dict[str, Path]:
    mods = {}
    for layer in LAYERS:
        for path in (ROOT / layer).rglob("*.py"):
            mods[module_name(path)] = path
        for ext in (ROOT / layer).rglob("*.so"):  # native modules: imported, import nothing of ours
            mods["memr1." + ".".join(ext.relative_to(ROOT).parts[:-1] + (ext.name.split(".")[0],))] = ext
    return mods


def runtime_nodes(tree: ast.AST):
    """Every node except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The modules of ours `name` imports: `from pkg import sub` names the submodule when it is one."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base)
    out = set()
    for m in found:
        while m.startswith("memr1.") and m not in mods:
            m = m.rsplit(".", 1)[0]
        if m in mods:
            out.add(m)
    return out - {name}


def graph() -> dict[str, set[str]]:
    mods = our_modules()
    return {n: imports_of(n, p, mods) if p.suffix == ".py" else set() for n, p in mods.items()}


def layer(module: str) -> str:
    return module.split(".")[1]


def engine_folders() -> list[str]:
    """engine/__init__.py's folders, bottom up, as its docstring lists them."""
    doc = ast.get_docstring(ast.parse((ROOT / "engine" / "__init__.py").read_text()))
    listing = doc.split("Folders, bottom up", 1)[1]
    folders = re.findall(r"^  (\w+)/ ", listing, re.M)
    assert folders and all((ROOT / "engine" / f).is_dir() for f in folders), folders
    return folders


def engine_place(module: str, folders: list[str]) -> int:
    """The module's folder's rank in engine, len(folders) for engine's top files."""
    parts = module.split(".")
    return folders.index(parts[2]) if len(parts) > 2 and parts[2] in folders else len(folders)


def violations(edges: dict[str, set[str]], folders: list[str]) -> list[str]:
    bad = []
    for src, targets in sorted(edges.items()):
        for dst in sorted(targets):
            a, b = layer(src), layer(dst)
            if a in ("memory_store", "kernels") and b != a:
                bad.append(f"{src} -> {dst}: {a}/ imports nothing of ours")
            elif a == "rl" and b in ("engine", "bench"):
                bad.append(f"{src} -> {dst}: rl/ never imports {b}/")
            elif a == b == "rl" and dst.startswith("memr1.rl.task") and not src.startswith("memr1.rl.task"):
                bad.append(f"{src} -> {dst}: rl/'s algorithms, records and contracts never import the task (rl/task/)")
            elif b == "bench" and a != "bench":
                bad.append(f"{src} -> {dst}: bench/ is imported by nothing")
            elif a == b == "engine" and engine_place(src, folders) < len(folders) and dst not in CONFIG_MODULES:
                if engine_place(dst, folders) >= engine_place(src, folders) and dst.split(".")[:3] != src.split(".")[:3]:
                    bad.append(f"{src} -> {dst}: an engine folder imports only the folders below it ({' < '.join(folders)})")
    return bad


def command_modules() -> set[str]:
    """engine's top files that engine/cli.py's HANDLERS name ("module:function" strings, read from its
    AST); a handler inside a library module (generation/model.py, rl/task/data/) is that module's own CLI."""
    tree = ast.parse((ROOT / "engine" / "cli.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HANDLERS" for t in node.targets):
            found = {v.value.split(":")[0] for v in node.value.values}
            return {m for m in found if m.startswith("memr1.engine.") and m.count(".") == 2}
    raise AssertionError("engine/cli.py has no HANDLERS")


def command_imports(edges: dict[str, set[str]], commands: set[str]) -> list[str]:
    return [f"{src} -> {dst}: a command module is imported by nothing (share through assembly.py or below)"
            for src, targets in sorted(edges.items()) for dst in sorted(targets & commands)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
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
    return out


CONVENTIONS = {"__init__", "config", "errors"}


def name_clashes(paths) -> dict[str, list[str]]:
    """File names (stem) held by more than one module, conventions aside."""
    by_name: dict[str, list[str]] = {}
    for path in paths:
        if path.suffix == ".py" and path.stem not in CONVENTIONS:
            by_name.setdefault(path.stem, []).append(str(path.relative_to(ROOT)))
    return {n: sorted(ps) for n, ps in by_name.items() if len(ps) > 1}


def test_one_name_per_file_across_layers():
    clashes = name_clashes(p for p in our_modules().values() if not p.relative_to(ROOT).parts[0] == "bench")
    assert not clashes, clashes


def test_layers_import_downward_only():
    bad = violations(graph(), engine_folders())
    assert not bad, "\n".join(bad)


def test_commands_are_siblings():
    commands = command_modules()
    assert {"memr1.engine.train", "memr1.engine.evaluate", "memr1.engine.rollout"} <= commands, commands
    bad = command_imports(graph(), commands)
    assert not bad, "\n".join(bad)


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_checks_see_what_they_forbid():
    """The rules themselves, on a made-up graph: each kind of violation, a cycle, a function-level import."""
    folders = ["observe", "generation", "training"]
    edges = {"memr1.kernels.gae": {"memr1.rl.records"}, "memr1.rl.task.turns": {"memr1.engine.loop"},
             "memr1.engine.loop": {"memr1.bench.common", "memr1.engine.training.dist"},
             "memr1.engine.training.dist": {"memr1.engine.loop", "memr1.engine.observe.runlog"},
             "memr1.engine.observe.runlog": {"memr1.engine.generation.config", "memr1.engine.generation.weights"},
             "memr1.rl.algos.losses": {"memr1.rl.records", "memr1.rl.task.hints"}}
    bad = {b.split(":")[0] for b in violations(edges, folders)}
    assert bad == {"memr1.kernels.gae -> memr1.rl.records", "memr1.rl.task.turns -> memr1.engine.loop",
                   "memr1.engine.loop -> memr1.bench.common", "memr1.engine.training.dist -> memr1.engine.loop",
                   "memr1.engine.observe.runlog -> memr1.engine.generation.weights",
                   "memr1.rl.algos.losses -> memr1.rl.task.hints"}
    commands = {"memr1.engine.train", "memr1.engine.rollout"}
    got = command_imports({"memr1.engine.rollout": {"memr1.engine.train", "memr1.engine.assembly"},
                           "memr1.engine.assembly": {"memr1.engine.loop"}}, commands)
    assert [b.split(":")[0] for b in got] == ["memr1.engine.rollout -> memr1.engine.train"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    made_up = [ROOT / f for f in ("rl/records.py", "memory_store/records.py", "rl/config.py", "engine/config.py")]
    assert name_clashes(made_up) == {"records": ["memory_store/records.py", "rl/records.py"]}
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from memr1.engine import loop\n"
           "def f():\n    from memr1.engine import train\n")
    names = [a.name for n in runtime_nodes(ast.parse(src)) if isinstance(n, ast.ImportFrom) for a in n.names]
    assert "train" in names and "loop" not in names
