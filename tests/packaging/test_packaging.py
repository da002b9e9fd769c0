"""The distribution is one import package, `kernelsearch`: top-level names like `kernels` or
`service` would collide with other distributions in a user's environment."""
from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("kernels", "search_space", "db", "service")
TOOLS = ("loadtest", "efficiency", "explore", "floors")


@pytest.mark.slow
def test_wheel_has_one_top_level_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, timeout=300)
    (wheel,) = tmp_path.glob("kernelsearch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"kernelsearch"}, tops
    for needed in ("kernelsearch/__init__.py", "kernelsearch/kernels/registry.py",
                   "kernelsearch/db/alembic.ini", "kernelsearch/db/migrations/env.py",
                   "kernelsearch/service/cli.py", "kernelsearch/service/routers/jobs.py",
                   "kernelsearch/search_space/spaces/"
                   "vision_rope_generation_bwd.toml",
                   "kernelsearch/kernels/cases/vision_rope_generation_bwd.json"):
        assert needed in names, needed
    # Every module of the source folders ships (a subpackage left out of pyproject's list would
    # import here, from the checkout, and fail only once installed).
    for folder in FOLDERS:
        for src in (ROOT / folder).rglob("*.py"):
            rel = src.relative_to(ROOT)
            if "__pycache__" in rel.parts:
                continue
            if rel.parts[:2] == ("service", "client"):  # the root package itself
                rel = Path(*rel.parts[2:])
            assert f"kernelsearch/{rel.as_posix()}" in names, f"{rel} is not in the wheel"
    # The measurement tools are docs/tools' own distribution (kernelsearch_tools), never the wheel's.
    for tool in TOOLS:
        assert not [n for n in names if n.endswith(f"/{tool}.py")], f"{tool} shipped in the wheel"
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry).decode()
    assert "[kernelsearch.kernels]" in text and "kernelsearch.service.cli:main" in text


def _bare_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] in FOLDERS]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] in FOLDERS:
                bad.append(node.module)
    return bad


def test_no_module_imports_the_folders_by_their_bare_names():
    """`import kernels` would load a second copy of the code from the checkout, not the package."""
    offenders = {}
    for folder in (*FOLDERS, "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if bad := _bare_imports(path):
                offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, offenders


def test_import_kernelsearch_is_light():
    """The root package resolves names lazily: importing it must not pull torch in."""
    code = "import sys, kernelsearch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_package_never_imports_the_tools():
    """kernelsearch_tools depends on kernelsearch, not the other way: the wheel works without it."""
    offenders = {}
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
            if bad := [m for m in names if m.split(".")[0] == "kernelsearch_tools"]:
                offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders, offenders


def test_the_tools_are_their_own_distribution():
    """`python -m kernelsearch_tools.NAME` runs from the editable docs/tools install (make install)."""
    import kernelsearch_tools

    assert Path(kernelsearch_tools.__file__).resolve().parent == ROOT / "docs/tools/kernelsearch_tools"
    for tool in TOOLS:
        assert (ROOT / "docs/tools/kernelsearch_tools" / f"{tool}.py").is_file(), tool


def test_build_installs_the_data_folders_without_setuptools_warnings(tmp_path):
    """Each data folder is a listed package: setuptools installs its files and prints none of its
    ~20-line "Package would be ignored" warnings (about 160 lines on the first install)."""
    lib = tmp_path / "lib"
    res = subprocess.run([sys.executable, "-c", "import setuptools; setuptools.setup()",
                          "egg_info", "--egg-base", str(tmp_path), "build_py", "-d", str(lib)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    assert "would be ignored" not in out and "as data is deprecated" not in out, out
    for needed in ("db/alembic.ini", "db/migrations/script.py.mako",
                   "db/migrations/versions/0001_initial_schema.py", "service/templates/case.html",
                   "service/static/dashboard.js", "service/data/h200_records.json",
                   "kernels/cases/vision_rope_generation_bwd.json",
                   "search_space/spaces/vision_rope_generation_bwd.toml"):
        assert (lib / "kernelsearch" / needed).is_file(), needed
