"""The opt-in stage log of ``tokentrail bench e2e``: nothing when off; when on, whole lines from several processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from schemas.stage_log import ENV, StageLog, read_stage_log

REPO = Path(__file__).resolve().parents[3]


def test_off_without_the_variable_and_marks_write_nothing(tmp_path, monkeypatch):
    log = StageLog.from_env({})
    assert log.on is False
    log.mark("r-1", "cons.delivered")
    assert list(tmp_path.iterdir()) == []


def test_marks_are_read_back_per_rollout_with_the_first_time_of_each_stage(tmp_path):
    path = tmp_path / "stages.jsonl"
    log = StageLog.from_env({ENV: str(path)})
    assert log.on
    log.mark(b"r-1", "proc.fetched", t=10.0)  # processors see the Kafka key
    log.mark("r-1", "proc.fetched", t=12.0)  # a redelivery marks it again, later
    log.mark("r-2", "cons.delivered", t=11.5)
    log.mark(None, "cons.delivered")  # no rollout: nothing to attribute it to
    log.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    marks = read_stage_log([*lines, '{"r": "r-3", "s": "cons.pol'])  # a line torn by a killed process
    assert marks == {"r-1": {"proc.fetched": 10.0}, "r-2": {"cons.delivered": 11.5}}


def test_a_log_that_cannot_be_written_turns_off_instead_of_failing(tmp_path):
    log = StageLog(tmp_path / "no-such-dir" / "stages.jsonl")
    log.mark("r-1", "cons.polled")
    assert log.on is False


def test_processes_sharing_the_file_never_interleave_lines(tmp_path):
    path = tmp_path / "stages.jsonl"
    code = ("import sys\nfrom schemas.stage_log import STAGES\n"
            "for i in range(300):\n    STAGES.mark(f'{sys.argv[1]}-{i}', 'cons.delivered')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, name], cwd=REPO, env={ENV: str(path), "PATH": ""})
             for name in ("a", "b", "c")]
    assert [p.wait(60) for p in procs] == [0, 0, 0]
    lines = path.read_text().splitlines()
    marks = read_stage_log(lines)
    assert len(lines) == 900 and len(marks) == 900
