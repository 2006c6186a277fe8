"""Print benchlab's requirements (and those of the given extras) from pyproject.toml, one a line,
leaving out torch and Triton: the install scripts use it on hosts whose torch must stay as it is.

    python scripts/requirements.py dev,postgres
"""
import sys
import tomllib
from pathlib import Path

KEPT = ("torch", "triton")
project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
extras = [e for e in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if e]
unknown = [e for e in extras if e not in project.get("optional-dependencies", {})]
if unknown:
    sys.exit(f"unknown extra(s) {', '.join(unknown)}; known: {', '.join(project['optional-dependencies'])}")
reqs = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
for r in reqs:
    name = r.split(";")[0].strip().split("[")[0]
    for op in "<>=!~ ":
        name = name.split(op)[0]
    if name.lower() not in KEPT:
        print(r)
