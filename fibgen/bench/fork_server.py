"""What the worker's fork server imports first (Note [isolated solutions] in isolation.py).

The server is a process the worker starts; it forks a solution process per solution. It asks
to die with the worker before importing anything heavy, so that a worker killed outright
(by the runner's timeout, or with the runner) takes the server along, and the server the
solution process it forked (Note [worker lifetime] in child.py). No watchdog thread here: a
process that forks must have no other thread.
"""

import os

from fibgen.bench.lifetime import die_with_parent, ignore_ctrl_c

# multiprocessing's server ignores SIGINT only once its preload is imported: a Ctrl-C while
# this module imports torch would end it with a traceback (Note [stopping bench]).
ignore_ctrl_c()
die_with_parent(os.getppid(), watchdog=False)

from fibgen.bench import isolation  # noqa: E402,F401  (what every solution process needs)

try:
    # The solution loader asks every solution's modules for Triton kernels (fibgen/runtime/
    # launch.py): Triton's import, 0.4 s a process on a CPU, is made once here. Its
    # interpreter switch is already set where there is no GPU (Note [CPU workers]).
    import triton.runtime.jit  # noqa: F401
except Exception:  # Triton missing or broken: solutions load without it, as anywhere
    pass
