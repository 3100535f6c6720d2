"""Would compiling the gateway's own Python bring it to vllm-router's cost? The working tree's
gateway against a copy of it whose request-path modules are compiled to C extensions, under ab.py.

The CPU that is left above vllm-router's is the interpreter's (bench/README.md: perf put about
15 µs of each relayed event in libpython). Two compilers take the modules as they are, with no
source change: mypyc (it ships with mypy; it uses the type annotations the code already carries
for mypy --strict, so attribute reads and calls between compiled functions skip the interpreter,
and it checks each declared type at run time) and Cython (``cythonize`` of the plain .py files,
no declarations: the same bytecode's work done through the C API). The copy is made in a
temporary folder (``gateway/`` and ``fleetspec/``, which the gateway imports), compiled there
(the extension modules lie beside the .py files, so ``python -m gateway`` run in that folder
imports them), then ``ab.py WORKING_TREE COPY`` measures both in alternated passes, with
vllm-router beside them.

    .venv/bin/python bench/compare/compiled.py [--compiler mypyc|cython] [--passes 8] [--paced] [--out FILE]

``--modules`` names the modules to compile (default: ``hot()``, the ones a request or a relayed
event runs through). ``--paced``: CPU per relayed event (ab.py's paced phase), else CPU per
request at 64 concurrent. ``--python`` runs both sides under another interpreter (ab.py's
``--base-python``/``--new-python``) and compiles for it.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def hot() -> list[str]:
    """The modules setup.py compiles (pyproject.toml's ``[tool.vllm-fleet] compiled``): the request
    path and the relayed event's."""
    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["vllm-fleet"]["compiled"])

PACKAGES = ("gateway", "fleetspec")  # and mypy's settings from pyproject.toml (its plugins)


def copy_tree(dest: Path) -> None:
    """The gateway's packages as they are in the working tree, without caches or built modules."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c"))
    # mypy's sections only: the build's setuptools would also read (and, where older, reject) the rest.
    sections = re.split(r"^(?=\[)", (ROOT / "pyproject.toml").read_text(), flags=re.M)
    (dest / "pyproject.toml").write_text("".join(s for s in sections if s.lstrip("[").startswith("tool.mypy")))


def compile_modules(tree: Path, compiler: str, modules: list[str], python: str = sys.executable) -> str:
    """Compile ``tree``'s gateway ``modules`` in place for ``python`` (the compiler is installed into
    its environment with pip when missing); the compiler and its version."""
    files = [f"gateway/{m}.py" for m in modules]
    dist = "mypy" if compiler == "mypyc" else "cython"
    argv = [python, "-m", "mypyc", *files] if compiler == "mypyc" else [python, "-m", "Cython.Build.Cythonize",
                                                                          "-i", "-q", "-3", *files]
    version = [python, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"]
    found = subprocess.run(version, capture_output=True, text=True)
    if found.returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", dist], check=True)
        found = subprocess.run(version, capture_output=True, text=True, check=True)
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{compiler} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    # mypyc's shared runtime is one more library (NAME__mypyc), here where it builds one module.
    built = sorted(n for n in (p.name.split(".")[0] for p in (tree / "gateway").glob("*.so")) if "__mypyc" not in n)
    if built != sorted(modules):
        raise SystemExit(f"{compiler} built {built}, not {sorted(modules)}")
    return f"{compiler} {found.stdout.strip()}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compiler", choices=("mypyc", "cython"), default="mypyc")
    ap.add_argument("--modules", default=",".join(hot()), help="gateway modules to compile, comma-separated")
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--paced", action="store_true", help="CPU per relayed event, not per request")
    ap.add_argument("--python", default=sys.executable,
                    help="both sides' gateways run under this interpreter (a virtual environment with the gateway's "
                         "dependencies), which the modules are compiled for")
    ap.add_argument("--out", type=Path, help="also write ab.py's lines here, after one naming the build")
    a = ap.parse_args(argv)
    modules = [m for m in a.modules.split(",") if m]
    with tempfile.TemporaryDirectory(prefix="fleet-compiled-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        built = compile_modules(tree, a.compiler, modules, a.python)
        head = f"base: the working tree, interpreted; new: {built}, modules {','.join(modules)}; python {a.python}"
        print(head, flush=True)
        cmd = [sys.executable, str(ROOT / "bench" / "compare" / "ab.py"), str(ROOT), str(tree), "--router",
               "--passes", str(a.passes), *(["--paced"] if a.paced else []),
               *(["--base-python", a.python, "--new-python", a.python] if a.python != sys.executable else [])]
        lines = [head]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as ab:  # its errors go to ours
            assert ab.stdout is not None
            for line in ab.stdout:
                sys.stdout.write(line)
                lines.append(line.rstrip("\n"))
        if ab.returncode != 0:
            raise SystemExit(f"ab.py failed ({ab.returncode})")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
