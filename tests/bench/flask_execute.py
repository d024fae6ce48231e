"""The peer for the /execute benchmark: a Flask server whose /execute behaves like the
OSWorld guest server's (subprocess.run with pipes, text mode, 120 s timeout), started on the
port given as the only argument. Run with Flask's development server, as OSWorld runs it."""

import os
import shlex
import subprocess
import sys

from flask import Flask, jsonify, request

app = Flask(__name__)


@app.route("/execute", methods=["POST"])
def execute():
    data = request.json
    shell = data.get("shell", False)
    command = data.get("command", "" if shell else [])
    if isinstance(command, str) and not shell:
        command = shlex.split(command)
    if isinstance(command, list):
        command = [os.path.expanduser(a) if a.startswith("~/") else a for a in command]
    try:
        done = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            shell=shell,
            text=True,
            timeout=120,
        )
    except Exception as e:  # the reference answers every failure this way
        return jsonify({"status": "error", "message": str(e)}), 500
    return jsonify(
        {
            "status": "success",
            "output": done.stdout,
            "error": done.stderr,
            "returncode": done.returncode,
        }
    )


if __name__ == "__main__":
    app.run(host="127.0.0.1", port=int(sys.argv[1]), threaded=True)
