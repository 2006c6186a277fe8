"""The repository stands alone: every file of the repo that a doc or a code comment names exists,
and the installed package carries no tool scripts."""
from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("backend", "worker", "kernels", "parallel", "frontend", "tests", "docs", "scripts", "benchmarks")
# a path under one of the repo's folders, as docs and comments write them
PATH = re.compile(r"(?<![\w./-])((?:%s)/[A-Za-z0-9_./-]*[A-Za-z0-9_])" % "|".join(TOP))


def _sources() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    files = [ROOT / f for f in tracked] if tracked else list(ROOT.rglob("*"))
    return [f for f in files if f.suffix in (".py", ".md", ".sh", ".toml", ".html", ".yml") or f.name == "Makefile"]


def test_every_repo_path_named_in_docs_and_comments_exists():
    missing = []
    for f in _sources():
        if "docs/results" in str(f.relative_to(ROOT)) and f.name != "README.md":
            continue  # recorded notes of past runs may name files of the tree they ran on
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for m in PATH.finditer(line):
                ref = m.group(1).rstrip(".")
                after = line[m.end():m.end() + 1]
                if after in ("*", "<", "{", "$") or ref.endswith(("_", "-")) or "..." in ref:
                    continue  # a pattern (model_*.jsonl, cell_<i>), not a file
                if not (ROOT / ref).exists() and not (ROOT / ref).with_suffix("").exists():
                    missing.append(f"{f.relative_to(ROOT)}:{n}: {ref}")
    assert not missing, "\n".join(missing)


def test_no_doc_or_comment_points_outside_the_repo():
    outside = [f"{f.relative_to(ROOT)}:{n}" for f in _sources() if f.suffix in (".py", ".md", ".sh")
               and "docs/results" not in str(f.relative_to(ROOT))
               for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
               if re.search(r"\b(DESIGN|MODEL)\.md\b|\.\./shared|shared/anchors", line)
               and f.name != "test_docs.py"]
    assert not outside, outside


def test_every_benchmark_script_is_in_the_benchmarks_index():
    """benchmarks/README.md is where a newcomer finds the tools: each script and study shell file has a row."""
    index = (ROOT / "benchmarks" / "README.md").read_text()
    scripts = [f.name for f in sorted((ROOT / "benchmarks").iterdir())
               if f.suffix in (".py", ".sh") and f.name != "__init__.py"]
    assert scripts
    assert [name for name in scripts if f"`{name}`" not in index] == []


def test_the_wheel_carries_the_service_not_the_tools(tmp_path):
    src = tmp_path / "src"  # the tracked files only: no build/ left over from an earlier build
    for rel in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split():
        if (ROOT / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((ROOT / rel).read_bytes())
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(tmp_path), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("benchlab-*.whl"))).namelist()
    assert any(n.startswith("backend/") for n in names) and any(n.startswith("backend/migrations/versions/")
                                                              for n in names)
    tools = [n for n in names if n.startswith(("benchmarks/", "tests/", "scripts/"))
             or "/benchmarks/" in n or n.endswith(("bench_queue.py", "localstack.py"))]
    assert not tools, tools
