"""`make airflow` / the demo's Airflow env: the API server on 127.0.0.1 unless asked, the
admin password generated into a mode-600 file and never printed."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp_path: Path, **extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "AMFLOW_ADMIN_PASSWORD"}
    env.update(ROOT=str(ROOT), PORT="18080", AIRFLOW_HOME=str(tmp_path / "home"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra)
    out = subprocess.run(["bash", "-c", "source scripts/airflow_env.sh && "
                          "echo HOST=$AIRFLOW__API__HOST"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True)
    return out.stdout + out.stderr


def test_airflow_binds_locally_and_keeps_the_password_out_of_logs(tmp_path):
    out = _env(tmp_path)
    assert "HOST=127.0.0.1" in out
    pw = tmp_path / "home" / "simple_auth_manager_passwords.json.generated"
    assert stat.S_IMODE(pw.stat().st_mode) == 0o600
    secret = pw.read_text().split('"')[3]
    assert len(secret) >= 12 and secret not in out
    assert _env(tmp_path) and pw.read_text().split('"')[3] == secret  # kept, not remade
    assert "HOST=0.0.0.0" in _env(tmp_path / "wide", AMFLOW_AIRFLOW_HOST="0.0.0.0")
    # make airflow's banner names the file, not the password
    script = (ROOT / "scripts" / "airflow.sh").read_text()
    assert "$PASSWORD" not in script.replace("$PASSWORDS", "")
