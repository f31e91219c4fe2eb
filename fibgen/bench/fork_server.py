"""What the worker's fork server imports first (Note [isolated solutions] in isolation.py).

The server is a process the worker starts; it forks a solution process per solution. It asks
to die with the worker before importing anything heavy, so that a worker killed outright
(by the runner's timeout, or with the runner) takes the server along, and the server the
solution process it forked (Note [worker lifetime] in child.py). No watchdog thread here: a
process that forks must have no other thread.
"""

import os

from fibgen.bench.child import die_with_parent

die_with_parent(os.getppid(), watchdog=False)

from fibgen.bench import isolation  # noqa: E402,F401  (what every solution process needs)
