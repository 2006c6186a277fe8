"""A process killed with SIGTERM still runs its cleanup, so the processes a Stack started stop too."""
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import sys, time
sys.path.insert(0, {root!r})
from tests.stack import exit_on_sigterm
exit_on_sigterm()
try:
    print("ready", flush=True)
    time.sleep(60)
finally:
    open({marker!r}, "w").write("cleaned up")
"""


def test_sigterm_runs_finally_blocks(tmp_path):
    marker = tmp_path / "marker"
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(root=str(ROOT), marker=str(marker))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 128 + signal.SIGTERM
    assert marker.read_text() == "cleaned up"
