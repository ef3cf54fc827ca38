"""Guards the apache-tvm-ffi pin: IR must survive save_json/load_json (newer ffi segfaults)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_primfunc_json_round_trip_in_a_subprocess(tmp_path: Path) -> None:
    # A subprocess, so the known failure mode (a segfault) fails this test, not the session.
    code = textwrap.dedent(
        """
        import tvm_ffi
        from tvm.script import tirx as T
        from dynshape_perception.compiler import tvm_adapter as tvmx

        @T.prim_func
        def add_one(a: T.handle, b: T.handle):
            n = T.int64()
            A = T.match_buffer(a, (n,), "float32")
            B = T.match_buffer(b, (n,), "float32")
            for i in range(n):
                B[i] = A[i] + T.float32(1)

        text = tvmx.save_json(add_one)
        back = tvmx.load_json(text)
        assert tvm_ffi.structural_equal(add_one, back), "round trip changed the PrimFunc"
        print("ok", len(text))
        """
    )
    # TVMScript parses the function's source, so it must live in a file.
    script = tmp_path / "round_trip.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert proc.stdout.startswith("ok")
