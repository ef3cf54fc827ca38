"""A node's process exits with its main's code once the node has closed, whatever the
interpreter's finalisation would wait for (a thread that a native call holds, say)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

# A node's run as ``entry.run`` does it, with a node whose main leaves a non-daemon thread
# waiting forever: interpreter finalisation would join it, and the process never end.
STUCK_THREAD_FAULT_INJECTOR = textwrap.dedent(
    """
    import sys, threading, types
    from dynshape_perception.nodes import entry

    def stuck_thread_main() -> int:
        threading.Thread(target=threading.Event().wait, daemon=False).start()
        print("node closed", flush=True)
        return int(sys.argv[1])

    node = types.ModuleType("dynshape_perception.nodes.stuck_thread_fault_injector")
    node.main = stuck_thread_main
    sys.modules[node.__name__] = node
    sys.exit(entry.run("stuck_thread_fault_injector"))
    """
)


def test_a_closed_node_exits_with_its_code_past_a_thread_that_would_hold_the_exit() -> None:
    for code in (0, 3):
        done = subprocess.run(
            [sys.executable, "-c", STUCK_THREAD_FAULT_INJECTOR, str(code)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == code, (done.returncode, done.stderr[-3000:])
        assert done.stdout == "node closed\n"
