"""Mutation score of one core module: ``mutmut`` run in a scratch copy of the checkout.

Usage (from the checkout root; a development tool, not part of CI)::

    python3 tools/mutate.py block_pool        # or any other name in MODULES
    python3 tools/mutate.py scheduler --show   # also print the diff of every survivor

Each module is mutated alone and each mutant runs only that module's own test files
(``MODULES``), so a run takes minutes, not hours. The run happens in a temporary copy of the
checkout's files (tracked and untracked-but-not-ignored), with the ``[tool.mutmut]`` section
written into that copy's pyproject.toml: the checkout itself is never touched and gets no
``mutants/`` folder. ``edge_llm/kernels`` and ``edge_llm/quant`` are symlinks in the copy, as
in a worktree, so ``quant/packing.py`` is mutated under its import path
``edge_llm/quant/packing.py``.

Survivors that were reviewed and found equivalent (no input can tell them apart from the
original, e.g. ``popitem(last=None)`` for ``last=False``) are listed in
``tools/mutation_equivalents.txt`` by their diff lines (optionally for one function only), so
the list survives renumbering; the score is killed / (mutants - reviewed equivalents). Timeouts
count as killed (the mutant loops) unless the mutant is a reviewed equivalent.
Why mutmut: it already generates, runs and records one-line mutants (operators, constants,
keyword arguments, deleted statements) with per-function test selection; this script only
adds the layout and the score.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from edge_llm import envs

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "tools" / "mutation_equivalents.txt"

# module -> (source files to mutate, test files or pytest node ids run against each mutant)
MODULES: dict[str, tuple[list[str], list[str]]] = {
    "block_pool": (
        ["edge_llm/engine/block_pool.py"],
        ["tests/test_block_pool.py", "tests/test_block_pool_spec.py"],
    ),
    "scheduler": (
        ["edge_llm/engine/scheduler.py"],
        [
            "tests/test_scheduler.py",
            "tests/test_scheduler_preemption.py",
            "tests/test_scheduler_policy.py",
            "tests/test_scheduler_property.py",
        ],
    ),
    "detokenizer": (
        ["edge_llm/engine/detokenizer.py"],
        ["tests/test_detokenizer.py", "tests/test_detokenizer_fallbacks.py"],
    ),
    "packing": (
        ["edge_llm/quant/packing.py"],
        ["tests/test_packing_checks.py", "tests/test_quant_formats.py"],
    ),
    "structured_output": (
        ["edge_llm/engine/structured_output.py"],
        ["tests/test_structured_output_spec.py"] + [
            f"tests/test_structured_output.py::{t}" for t in (
                "test_bitmask_op_matches_llguidance_per_token_mask",
                "test_masked_sampler_equals_reference_on_random_logits",
                "test_constrained_rows_are_not_chainable_or_plain_greedy",
                "test_unenforceable_constraints_are_refused_naming_the_reason")],
        # not its engine tests: they check the engine's use of the matchers and build a model
        # in each mutant's process (over a minute per mutant on 2 shared cores)
    ),
    "tool_parsers": (
        ["edge_llm/server/tool_parsers.py"],
        ["tests/test_tool_parsers.py", "tests/test_tool_parsers_spec.py"],
    ),
    "reasoning_parsers": (
        ["edge_llm/server/reasoning_parsers.py"],
        ["tests/test_tool_parsers.py", "tests/test_reasoning_parsers.py"],
    ),
}


# what the tests import besides the mutated files (mutmut copies only what it is told)
ALSO_COPY = ["edge_llm", "kernels", "quant", "tests", "benchmarks"]


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def _mutmut() -> list[str]:
    beside = Path(sys.executable).parent / "mutmut"  # a venv run as .venv/bin/python
    exe = str(beside) if beside.exists() else shutil.which("mutmut")
    if exe is None:
        sys.exit("mutate.py: mutmut is not installed (see docs/testing.md).")
    return [exe]


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_symlink() or not src.is_file():
            continue  # the package-dir links are made below; deleted files are skipped
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    for name in ("kernels", "quant"):  # setuptools package-dir: edge_llm.<name> is ./<name>
        link = dest / "edge_llm" / name
        if not link.exists():
            link.symlink_to(Path("..") / name)


def _configure(work: Path, sources: list[str], tests: list[str]) -> None:
    """mutmut's settings, in the copy's pyproject.toml only."""
    with open(work / "pyproject.toml", "a") as f:
        f.write(
            "\n[tool.mutmut]\n"
            f"source_paths = {_toml_list(sources)}\n"
            f"also_copy = {_toml_list(ALSO_COPY)}\n"
            f"pytest_add_cli_args = {_toml_list(['-p', 'no:cacheprovider', '-x', '-q'])}\n"
            f"pytest_add_cli_args_test_selection = {_toml_list(tests)}\n"
        )


def _equivalents() -> set[tuple[str, str, str]]:
    """(scope, removed line, added line) of reviewed equivalent mutants. The scope is "" (any
    mutant with these lines) or, after a line ``@ Class.method`` or ``@ function``, that
    function's mutants only: for lines that also occur where the mutant is not equivalent."""
    entries = set()
    if not EQUIVALENTS.exists():
        return entries
    lines = [ln.rstrip("\n") for ln in EQUIVALENTS.read_text().splitlines()]
    scope = ""
    for i, line in enumerate(lines):
        if line.startswith("@ "):
            scope = line[2:].strip()
        elif line.startswith("- ") and i + 1 < len(lines) and lines[i + 1].startswith("+ "):
            entries.add((scope, line[2:].strip(), lines[i + 1][2:].strip()))
        elif not line.startswith("+ "):
            scope = ""  # a scope covers the pairs right below it
    return entries


def _is_equivalent(name: str, minus: str, plus: str,
                   entries: set[tuple[str, str, str]]) -> bool:
    """Whether mutant ``name`` (mutmut's: ``module.xǁClassǁmethod__mutmut_N`` for a method,
    ``module.x_function__mutmut_N`` for a function) is a reviewed equivalent."""
    function = name.rpartition("__mutmut_")[0].rpartition(".")[2]
    for scope, removed, added in entries:
        if (removed, added) != (minus, plus):
            continue
        cls, _, method = scope.rpartition(".")
        if not scope or function == (f"x\u01c1{cls}\u01c1{method}" if cls else f"x_{scope}"):
            return True
    return False


def _diff_pair(work: Path, name: str) -> tuple[str, str, str]:
    """(removed line, added line, full diff) of a mutant, as ``mutmut show`` prints it."""
    diff = subprocess.run(_mutmut() + ["show", name], cwd=work, capture_output=True,
                          text=True).stdout
    minus = [ln[1:].strip() for ln in diff.splitlines()
             if ln.startswith("-") and not ln.startswith("---")]
    plus = [ln[1:].strip() for ln in diff.splitlines()
            if ln.startswith("+") and not ln.startswith("+++")]
    return " / ".join(minus), " / ".join(plus), diff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("module", choices=sorted(MODULES))
    parser.add_argument("--show", action="store_true", help="print each survivor's diff")
    parser.add_argument("--max-children", type=int, default=1,
                        help="mutants run in parallel (default 1: the machine is shared)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copy")
    parser.add_argument("--time-limit", type=float, default=None, metavar="S",
                        help="stop mutmut after S seconds, score the mutants checked so far "
                             "and keep the copy for --resume")
    parser.add_argument("--resume", type=Path, default=None, metavar="DIR",
                        help="go on with the mutants left in a kept scratch copy")
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="run only these mutants (names or fnmatch patterns, as printed), "
                             "e.g. the survivors of an earlier run after adding tests")
    args = parser.parse_args(argv)

    sources, tests = MODULES[args.module]
    sources = [s for s in sources if (ROOT / s).exists()]  # merged modules drop out
    tests = [t for t in tests if (ROOT / t.partition("::")[0]).exists()]
    if args.resume is not None:
        work, args.keep = args.resume, True
    else:
        work = Path(tempfile.mkdtemp(prefix=f"mutate-{args.module}-"))
    try:
        if args.resume is None:
            _copy_checkout(work)
            _configure(work, sources, tests)
        env = envs.child_environ({envs.PYTHONDONTWRITEBYTECODE: "1"})
        run = subprocess.Popen(["nice", "-n", "5"] + _mutmut()
                               + ["run", "--max-children", str(args.max_children)]
                               + args.only,
                               cwd=work, env=env, stdout=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            returncode = run.wait(timeout=args.time_limit)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGTERM)  # mutmut and its forked mutants
            run.wait()
            returncode, args.keep = 0, True
        if returncode:
            print(f"mutate.py: mutmut run exited with {returncode} (in {work})")
            args.keep = True
            return returncode
        listing = subprocess.run(_mutmut() + ["results", "--all", "true"], cwd=work,
                                 capture_output=True, text=True, env=env).stdout
        status = {}
        for line in listing.splitlines():
            name, sep, state = line.strip().rpartition(": ")
            if sep:
                status[name] = state
        pending = [name for name, state in status.items() if state == "not checked"]
        for name in pending:
            del status[name]
        equivalent = _equivalents()
        killed = sum(1 for s in status.values() if s == "killed")
        survivors, eq = [], 0
        for name, state in status.items():
            if state == "killed":
                continue
            minus, plus, diff = _diff_pair(work, name)
            if _is_equivalent(name, minus, plus, equivalent):  # out of the score, timed out too
                eq += 1
            elif state == "timeout":
                killed += 1
            else:
                survivors.append((name, state, diff))
        scored = len(status) - eq
        score = 100.0 * killed / scored if scored else 0.0
        print(f"{args.module}: {len(status)} mutants, {eq} reviewed equivalent, "
              f"{killed} killed of {scored} non-equivalent = {score:.1f}% "
              f"({len(survivors)} left: {', '.join(sorted({s for _, s, _ in survivors}))})"
              + (f"; {len(pending)} not checked yet (--resume {work})" if pending else ""))
        for name, state, diff in survivors:
            print(f"  {state}: {name}")
            if args.show:
                print("\n".join("    " + ln for ln in diff.splitlines()
                                if ln[:1] in "+-" and ln[:3] not in ("---", "+++")))
        return 0
    finally:
        if args.keep:
            print(f"scratch copy kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
