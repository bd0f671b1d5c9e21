"""Exit 1 with a one-line reason when any given TCP port already has a listener.

Used by scripts/airflow.sh before anything starts. SO_REUSEADDR makes a port left in
TIME_WAIT count as free (Airflow can bind it); only a live listener makes bind fail.
"""
from __future__ import annotations

import socket
import sys


def busy(port: int) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def main(argv: list[str]) -> int:
    for raw in argv:
        port = int(raw)
        why = busy(port)
        if why:
            print(f"error: port {port} is busy ({why}): another Airflow or server is "
                  f"listening there. Stop it, or pick free ports, e.g. AIRFLOW_PORT=8081 "
                  f"make airflow (task log servers: AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT, "
                  f"AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT). Nothing was started.",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
