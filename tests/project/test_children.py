"""No test waits on a child process without a bound (a hung child once held the suite for an hour)."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

import children
import pytest

TESTS = Path(__file__).parent
RUNNERS = {"run", "call", "check_call", "check_output"}  # subprocess's functions that wait for the child
PIPES = {"stdout", "stderr"}
READS = {"read", "readline", "readlines"}


def _unbounded(call: ast.Call) -> str | None:
    """Why ``call`` may wait on a child for ever, or None."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    keywords = {k.arg for k in call.keywords}
    owner = func.value
    if func.attr in ("communicate", "wait") and not call.args and "timeout" not in keywords:
        return f".{func.attr}() without a timeout"
    if func.attr in READS and isinstance(owner, ast.Attribute) and owner.attr in PIPES:
        return f"a blocking .{owner.attr}.{func.attr}() (use children.Lines)"
    if isinstance(owner, ast.Name) and owner.id == "subprocess" and func.attr in RUNNERS:
        return None if "timeout" in keywords else f"subprocess.{func.attr} without a timeout"
    if isinstance(owner, ast.Name) and owner.id == "os" and func.attr == "waitpid":
        flags = call.args[1] if len(call.args) > 1 else None
        if isinstance(flags, ast.Constant) and flags.value == 0:
            return "a blocking os.waitpid (use children.reap)"
    return None


def test_no_test_waits_on_a_child_without_a_bound():
    found = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name == "children.py":  # the bounded helpers themselves
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and (why := _unbounded(node)):
                found.append(f"{path.name}:{node.lineno}: {why}")
    assert not found, "\n".join(found)


def test_the_audit_sees_each_unbounded_wait():
    for code in (
        "p.communicate()",
        "p.wait()",
        "p.stderr.read()",
        "proc.stdout.readline()",
        "subprocess.run(['x'])",
        "os.waitpid(pid, 0)",
    ):
        assert _unbounded(ast.parse(code).body[0].value), code
    for code in ("p.communicate(timeout=5)", "p.wait(timeout=5)", "subprocess.run(['x'], timeout=5)"):
        assert _unbounded(ast.parse(code).body[0].value) is None, code


SILENT = "import sys, time; sys.stderr.write('partial'); sys.stderr.flush(); time.sleep(600)"


def test_a_child_that_hangs_holding_its_pipe_fails_the_test_in_bounded_time():
    """The old assertion message read the hung child's stderr to its end, so the test waited for the
    child; ``fail`` kills it first and quotes what it wrote."""
    began = time.monotonic()
    command = [sys.executable, "-c", SILENT]
    with children.started(command, stderr=subprocess.PIPE, text=True) as proc:
        with pytest.raises(AssertionError, match="still running after 1 s; killed. stderr: partial"):
            children.finish(proc, timeout=1)
        assert proc.poll() is not None
    silent = children.started(command, stdout=subprocess.PIPE, text=True)
    with silent as proc, pytest.raises(AssertionError, match="no line within 0.5 s"):
        children.Lines(proc.stdout).next(timeout=0.5)
    assert time.monotonic() - began < 30
