"""The attention_client package has no import cycle: no module imports (at its top, inside a
function, or under TYPE_CHECKING) a module that imports it back, directly or through others.

Reads the package's source with ast (imports nothing, needs no server or stubs). Run by CTest
as python_import_cycle_test; by hand:
/usr/bin/python3 -m unittest discover -s client/python/tests -p test_imports.py
"""
import ast
import os
import unittest

PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "attention_client")
PACKAGE = "attention_client"


def package_modules(directory, package):
    """{module name: file path} of every .py file of the package (subpackages too)."""
    modules = {}
    for root, _, files in os.walk(directory):
        parts = [package] + os.path.relpath(root, directory).split(os.sep)
        parts = [p for p in parts if p != "."]
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            if name == "__init__.py":
                modules[".".join(parts)] = path
            else:
                modules[".".join(parts + [name[:-3]])] = path
    return modules


def import_edges(modules):
    """{module: {imported module of the package: first line importing it}}: every import
    statement anywhere in the module. `from X import name` counts X, and X.name when that is
    a module of the package; the package a module sits in is not counted unless named."""
    edges = {}
    for module, path in modules.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_package = os.path.basename(path) == "__init__.py"
        here = module.split(".") if is_package else module.split(".")[:-1]
        targets = edges.setdefault(module, {})

        def add(name, line):
            if name in modules and name != module:
                targets.setdefault(name, line)

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        add(f"{source}.{alias.name}", node.lineno)
                    else:
                        add(source, node.lineno)
    return edges


def cycles(edges):
    """The strongly connected components of more than one module (each an import cycle),
    sorted, by Tarjan's algorithm."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(component, edges):
    """The imports between a cycle's modules, one per line: 'a:12 imports b'."""
    lines = []
    for module in component:
        for target, line in sorted(edges[module].items()):
            if target in component:
                lines.append(f"  {module}:{line} imports {target}")
    return "\n".join(lines)


class ImportCycleTest(unittest.TestCase):
    def test_the_checker_finds_a_cycle(self):
        # a -> b -> c -> a is one cycle; d only imports into it.
        edges = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
        self.assertEqual(cycles(edges), [["a", "b", "c"]])
        self.assertEqual(cycles({"a": {"b": 1}, "b": {}}), [])

    def test_package_has_no_import_cycle(self):
        modules = package_modules(PACKAGE_DIR, PACKAGE)
        self.assertIn(f"{PACKAGE}.client", modules)
        self.assertIn(f"{PACKAGE}.session", modules)
        edges = import_edges(modules)
        # The walk sees imports at all: the package's __init__ imports client.
        self.assertIn(f"{PACKAGE}.client", edges[PACKAGE])
        found = cycles(edges)
        self.assertEqual(found, [], "import cycles in attention_client:\n" +
                         "\n".join(describe(c, edges) for c in found))


if __name__ == "__main__":
    unittest.main()
