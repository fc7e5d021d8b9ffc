"""Compile roq's hot loops (appliance/roq/log/_native.py) with mypyc into an extension beside the
source, where `import roq.log._native` finds it first (issue 35; docs/benchmarks.md, "Where a
message's time goes"). Run by `make setup` and before the frozen build; roq runs without it
(format.py then keeps to its pure-Python code), so a machine without a C compiler loses speed,
not function.

    python packaging/build_native.py           # build if the source is newer than the extension
    python packaging/build_native.py --clean   # remove the extension (pure Python from then on)

Needs mypy (its mypyc), a C compiler and Python's headers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPLIANCE = ROOT / "appliance"
SOURCES = ["roq/log/_native.py"]
SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def extension(source: str) -> Path:
    return APPLIANCE / (source.removesuffix(".py") + SUFFIX)


def stale() -> bool:
    """Whether an extension is missing or older than its source (or roq/log/record.py, whose
    Record the compiled code builds)."""
    inputs = [APPLIANCE / s for s in SOURCES] + [APPLIANCE / "roq/log/record.py"]
    newest = max(path.stat().st_mtime for path in inputs)
    return any(not extension(s).exists() or extension(s).stat().st_mtime < newest for s in SOURCES)


def build() -> None:
    from mypyc.build import mypycify  # only the build needs mypy
    from setuptools import Distribution

    with tempfile.TemporaryDirectory(prefix="roq-mypyc-") as scratch:
        cwd = os.getcwd()
        os.chdir(APPLIANCE)  # module names follow from the paths, relative to the package root
        try:
            modules = mypycify(SOURCES, opt_level="3", target_dir=os.path.join(scratch, "c"))
            dist = Distribution({"name": "roq-native", "ext_modules": modules})
            command = dist.get_command_obj("build_ext")
            command.inplace = True
            command.build_temp = os.path.join(scratch, "temp")
            dist.run_command("build_ext")
        finally:
            os.chdir(cwd)
    shutil.rmtree(APPLIANCE / "build", ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clean", action="store_true", help="remove the built extension")
    parser.add_argument("--force", action="store_true", help="build even if up to date")
    args = parser.parse_args()
    if args.clean:
        for source in SOURCES:
            extension(source).unlink(missing_ok=True)
        return 0
    if args.force or stale():
        build()
        sys.stderr.write("roq: compiled " + ", ".join(SOURCES) + " (mypyc)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
