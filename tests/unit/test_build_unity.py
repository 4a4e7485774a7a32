"""csrc/ compiled as one unit per compiler job where there are fewer jobs than files
(torch_fl/unity_build.py): every source in exactly one unit, the heavy aten/ files spread, the
units rewritten only when their text changes, and MAX_JOBS read with a clear error."""

from __future__ import annotations

import runpy
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
unity = runpy.run_path(str(REPO / "torch_fl" / "unity_build.py"))
SOURCES = sorted(str(p.relative_to(REPO)) for p in (REPO / "csrc").rglob("*.cpp"))


@pytest.mark.parametrize("jobs", [1, 2, 3, 4, len(SOURCES), len(SOURCES) + 5])
def test_every_source_lands_in_exactly_one_group(jobs):
    groups = unity["group"](SOURCES, jobs)
    assert len(groups) == min(jobs, len(SOURCES))
    flat = [s for g in groups for s in g]
    assert sorted(flat) == SOURCES and len(set(flat)) == len(flat)
    sizes = [len(g) for g in groups]
    assert max(sizes) - min(sizes) <= 1


def test_two_jobs_split_the_aten_files():
    aten = {s for s in SOURCES if s.startswith("csrc/aten/")}
    for members in unity["group"](SOURCES, 2):
        assert aten & set(members), members


def test_bad_job_counts_name_the_fix():
    with pytest.raises(ValueError, match="at least 1"):
        unity["group"](SOURCES, 0)
    for raw, text in (("two", "not a whole number"), ("0", "at least 1 job"), ("-3", "at least")):
        with pytest.raises(ValueError, match=text) as info:
            unity["compile_jobs"]({"MAX_JOBS": raw})
        assert "MAX_JOBS=2" in str(info.value)
    assert unity["compile_jobs"]({"MAX_JOBS": " 3 "}) == 3
    assert unity["compile_jobs"]({}) >= 1


def test_units_are_generated_includes_rewritten_only_on_change(tmp_path):
    root = tmp_path
    for rel in ("csrc/a/x.cpp", "csrc/a/y.cpp", "csrc/b/z.cpp"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"int {Path(rel).stem}() {{ return 1; }}\n")
    srcs = ["csrc/b/z.cpp", "csrc/a/x.cpp", "csrc/a/y.cpp"]
    # A job per file: the sources themselves, nothing generated.
    assert unity["units"](root, srcs, 3) == sorted(srcs)
    assert not (root / unity["UNITS_DIR"]).exists()
    names = unity["units"](root, srcs, 2)
    assert names == ["build/unity/unit_0_of_2.cpp", "build/unity/unit_1_of_2.cpp"]
    texts = [(root / n).read_text() for n in names]
    assert '#include "a/x.cpp"' in texts[0] and '#include "b/z.cpp"' in texts[0]
    assert '#include "a/y.cpp"' in texts[1]
    stamp = (root / names[0]).stat().st_mtime_ns
    assert unity["units"](root, srcs, 2) == names
    assert (root / names[0]).stat().st_mtime_ns == stamp
    # The units compile and link into one object set with every function.
    objs = []
    for n in names:
        obj = root / (n + ".o")
        subprocess.run(["c++", "-c", "-I", str(root / "csrc"), str(root / n), "-o", str(obj)],
                       check=True)  # fmt: skip
        objs.append(str(obj))
    main = root / "main.cpp"
    main.write_text("int x(); int y(); int z();\nint main() { return x() + y() + z() - 3; }\n")
    exe = root / "prog"
    subprocess.run(["c++", str(main), *objs, "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)]).returncode == 0


@pytest.mark.parametrize("value", ["two", "0"])
def test_invoke_build_refuses_a_bad_max_jobs_in_one_line(value):
    import os
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "invoke", "build"],
        cwd=REPO,
        env={**os.environ, "MAX_JOBS": value},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"MAX_JOBS={value!r}" in proc.stderr and "MAX_JOBS=2" in proc.stderr
    assert "pip" not in proc.stdout + proc.stderr  # refused before pip ran
