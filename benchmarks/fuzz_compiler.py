"""Fuzz the compiler with mutated catalogue families: count cases and uncaught exceptions.

    python benchmarks/fuzz_compiler.py [--cases 100000] [--seed 0] [--jobs 2]

Each case mutates one seed (a family of definitions/, or a small file whole; see
tests/_mutations.py) one to four times, then runs what `fibgen check`, `fibgen fmt` and
`fibgen build` run in memory:

* compile: a module, or error diagnostics that each carry a position in the file;
* fmt: canonical text, which formats to itself again and compiles to the same definitions,
  or diagnostics; never an "internal error" (fmt checks that its output means the same and
  is its own canonical form, and says so when not);
* build: every emitter over the module (for the cases that compile), as text.

Anything else (an exception, a broken invariant) is printed with the case's seed, so
`--replay SEED` reruns it alone. Not a test: the CI's property test (tests/test_fuzz.py)
runs the same mutations a few thousand times; this runs them a hundred thousand.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("FIBGEN_CACHE_DIR", "")  # keep a hundred thousand cases out of black's cache

from _mutations import mutate, seeds  # noqa: E402

_SEEDS: list[str] = []


def case_text(seed: int) -> str:
    """The mutated text of case `seed` (the same on every machine and run)."""
    rng = random.Random(seed)
    pool = _SEEDS or seeds()
    base = pool[rng.randrange(len(pool))]
    return mutate(base, rng.randrange, pool, 1 + rng.randrange(4))


def problems(text: str, build: bool) -> list[str]:
    """What went wrong with one text: an empty list when everything held.

    A SyntaxWarning that Python would print to the user's terminal counts as a problem.
    """
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SyntaxWarning)
        out = _problems(text, build)
    out += [f"warning printed: {w.message}" for w in caught if w.category is SyntaxWarning]
    return out


def _problems(text: str, build: bool) -> list[str]:
    from fibgen.codegen import generate
    from fibgen.compiler import compile_sources
    from fibgen.compiler.formatter import format_text

    out = []
    result = compile_sources([("f.fidef", "f.fidef", text)])
    if result.module is None:
        errors = [d for d in result.diagnostics if d.severity == "error"]
        if not errors:
            out.append("no module and no error")
        for d in errors:
            if d.span is None or d.span.line < 1 or d.span.file != "f.fidef":
                out.append(f"error without a position: {d.message}")
    elif build:
        from fibgen.codegen.errors import GenerateError

        try:
            generate(result.module)
        except GenerateError as exc:  # `fibgen build` prints it; `fibgen check` said ok
            out.append(f"check passed, build refused: {str(exc)[:60]}")
    formatted, diags = format_text(text, "f.fidef")
    # "internal error: formatting would change ..." (the meaning; the text if run again)
    out += ["fmt: " + d.message for d in diags if d.message.startswith("internal error")]
    if formatted is not None:
        again, _ = format_text(formatted, "f.fidef")
        if again != formatted:
            out.append("fmt is not idempotent")
        if result.module is not None:
            reformatted = compile_sources([("f.fidef", "f.fidef", formatted)]).module
            if reformatted is None or reformatted.definitions != result.module.definitions:
                out.append("fmt changed the definitions")
    return out


def run_case(seed: int, build: bool) -> tuple[str, list[str]]:
    """(kind, details) of what went wrong with case `seed`; kind "" when nothing did."""
    text = case_text(seed)
    try:
        found = problems(text, build)
    except Exception as exc:  # what the fuzzer is for: count it, show it
        # Named by the innermost frame in fibgen and the original exception (Lark wraps
        # what a transformer raises in a VisitError).
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if "fibgen" in f.filename]
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        original = getattr(exc, "orig_exc", exc)
        kind = f"exception {type(original).__name__} at {where}: {str(original)[:60]}"
        return kind, [traceback.format_exc(limit=-4)]
    return (found[0], found) if found else ("", [])


def _worker(chunk: list[int], build_every: int, current, conn) -> None:
    """Run cases in order, telling the parent which one runs (it kills this on a hang)."""
    import resource

    # A case that allocates without bound gets a MemoryError here, not the machine's memory.
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    _SEEDS.extend(seeds())
    for seed in chunk:
        current[0], current[1] = seed, time.monotonic()
        kind, details = run_case(seed, seed % build_every == 0)
        conn.send((seed, kind, details))
    current[0] = -1
    conn.send(None)


def run_all(first: int, count: int, jobs: int, build_every: int, timeout: float):
    """Yield (seed, kind, details) for every case; a case past `timeout` seconds is a hang."""
    ctx = multiprocessing.get_context("fork")
    todo = [list(range(s, min(s + 500, first + count))) for s in range(first, first + count, 500)]
    running: list[tuple] = []
    while todo or running:
        while todo and len(running) < jobs:
            chunk = todo.pop(0)
            current = ctx.Array("d", [-1.0, time.monotonic()])
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(chunk, build_every, current, child))
            proc.start()
            child.close()
            running.append((proc, parent, current, chunk, set()))
        time.sleep(0.2)
        for entry in list(running):
            proc, conn, current, chunk, done = entry
            finished = False
            while conn.poll():
                try:
                    msg = conn.recv()
                except EOFError:
                    finished = True
                    break
                if msg is None:
                    finished = True
                    break
                done.add(msg[0])
                yield msg
            seed = int(current[0])
            hung = seed >= 0 and time.monotonic() - current[1] > timeout
            if hung or finished or not proc.is_alive():
                if proc.is_alive() and not finished:
                    proc.kill()
                proc.join()
                running.remove(entry)
                rest = [s for s in chunk if s not in done]
                if hung:
                    yield seed, f"hang (over {timeout:.0f} s)", []
                    rest.remove(seed)
                elif rest and not finished:
                    seed = rest.pop(0)
                    yield seed, f"worker died (exit code {proc.exitcode})", []
                if rest:
                    todo.insert(0, rest)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0, help="first case seed")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a hang")
    parser.add_argument(
        "--build-every",
        type=int,
        default=10,
        help="run the emitters on every Nth case that compiles (they are slower)",
    )
    parser.add_argument("--replay", type=int, help="run one case seed and print its text")
    args = parser.parse_args()
    if args.replay is not None:
        text = case_text(args.replay)
        print(repr(text))
        print(run_case(args.replay, build=True))
        return 0
    start = time.perf_counter()
    failures = exceptions = 0
    kinds: collections.Counter = collections.Counter()
    cases = run_all(args.seed, args.cases, args.jobs, args.build_every, args.timeout)
    for n, (seed, kind, details) in enumerate(cases, 1):
        if kind:
            failures += 1
            exceptions += kind.startswith(("exception", "hang", "worker died"))
            kinds[kind] += 1
            if kinds[kind] <= 3:
                print(f"case {seed}: {kind}", flush=True)
                for line in details[-1:]:
                    print(line, flush=True)
        if n % 10_000 == 0:
            print(f"  {n} cases, {exceptions} exceptions or hangs", flush=True)
    elapsed = time.perf_counter() - start
    print(
        f"{args.cases} cases (seeds {args.seed}..{args.seed + args.cases - 1}; emitters on "
        f"every {args.build_every}th that compiles): {exceptions} exceptions or hangs, "
        f"{failures - exceptions} other problems, {elapsed:.0f} s"
    )
    for kind, count in kinds.most_common():
        print(f"  {count:6d}  {kind}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
