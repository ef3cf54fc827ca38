"""A node killed by a fatal signal writes every thread's Python stack before TVM's native
backtrace, so a crash in the field says where it happened."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

# A node's start-up as ``entry.run`` does it, with a node whose main dereferences NULL while a
# second thread sleeps. The tracker's module is imported first, as a node's own imports load
# tvm_ffi (and its SIGSEGV handler) before ``run`` reaches the node.
SEGFAULT_FAULT_INJECTOR = textwrap.dedent(
    """
    import ctypes, importlib, sys, threading, time, types
    from dynshape_perception.nodes import entry

    importlib.import_module("dynshape_perception.nodes.tracker_node")

    def sleeping_helper() -> None:
        time.sleep(60.0)

    def segfaulting_main() -> int:
        threading.Thread(target=sleeping_helper, daemon=True).start()
        time.sleep(0.2)
        ctypes.string_at(0)
        return 0

    node = types.ModuleType("dynshape_perception.nodes.segfault_fault_injector")
    node.main = segfaulting_main
    sys.modules[node.__name__] = node
    sys.exit(entry.run("segfault_fault_injector"))
    """
)


def test_a_segfault_names_every_threads_python_stack_then_the_native_one() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SEGFAULT_FAULT_INJECTOR],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    said = done.stderr
    assert done.returncode == -signal.SIGSEGV, (done.returncode, said[-3000:])
    python_stacks = said.find("Fatal Python error: Segmentation fault")
    assert python_stacks >= 0, said[-3000:]
    assert "in segfaulting_main" in said[python_stacks:], said[-3000:]
    assert "in sleeping_helper" in said[python_stacks:], said[-3000:]
    # The signal went on to TVM's handler after the Python stacks.
    assert said.find("Segfault encountered", python_stacks) > python_stacks, said[-3000:]
