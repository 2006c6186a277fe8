"""The import rules of docs/architecture.md, checked on the source: who may import whom."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "kernels": {"parallel", "worker", "backend", "frontend"},
    "parallel": {"worker", "backend", "frontend"},
    "worker": {"backend", "frontend"},
    "frontend": {"backend", "worker", "kernels", "parallel", "torch", "triton"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_follow_the_layout(package):
    bad = {str(p.relative_to(ROOT)): sorted(imported_roots(p) & FORBIDDEN[package])
           for p in (ROOT / package).rglob("*.py")}
    assert not {k: v for k, v in bad.items() if v}


def test_backend_never_imports_torch_or_triton_at_module_level():
    for p in (ROOT / "backend").rglob("*.py"):
        top = {n.names[0].name.split(".")[0] if isinstance(n, ast.Import) else (n.module or "").split(".")[0]
               for n in ast.parse(p.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))}
        assert not top & {"torch", "triton", "kernels", "parallel"}, p


def test_the_api_and_the_suites_parameter_models_import_no_torch():
    import subprocess
    import sys

    code = ("import sys, backend.main, backend.cli\n"
            "from worker.suites import get_suite, suite_names\n"
            "[get_suite(n).Params.model_json_schema() for n in suite_names()]\n"
            "import kernels.names, parallel.names\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"
