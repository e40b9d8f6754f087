"""`typedlm ask`: the whole request body in, the response body out, clear errors on bad input."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from typedlm.core.settings import keys_from_env

REQUEST = {
    "model": "jev-latest",
    "state": {"message": "Is my parcel lost? It has not moved for ten days."},
    "questions": {
        "lost": {"type": "noul", "instructions": "Is the customer worried about a lost parcel?"},
        "topic": {"type": "choice", "criteria": {"shipping": None, "billing": None}},
        "mood": {"type": "score", "criteria": ["calm", "worried", "furious"]},
    },
}


def typedlm(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "typedlm.cli", *args], input=stdin, capture_output=True, text=True, timeout=600
    )


def test_ask_reads_stdin_and_prints_the_response_body(embedded_dir):
    done = typedlm("ask", stdin=json.dumps(REQUEST))
    assert done.returncode == 0, done.stderr
    response = json.loads(done.stdout)
    assert response["model"] == "smollm2-135m-instruct"
    assert set(response["answers"]) == {"lost", "topic", "mood"}
    assert response["answers"]["topic"]["type"] == "choice"
    assert response["usage"]["input_tokens"] > 0


def test_ask_reads_a_file(tmp_path, embedded_dir):
    path = tmp_path / "request.json"
    path.write_text(json.dumps({**REQUEST, "questions": {"q": REQUEST["questions"]["lost"]}}))
    done = typedlm("ask", str(path), "--indent", "0")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["answers"]["q"]["type"] == "noul"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({**REQUEST, "questions": {"q": {"type": "maybe"}}}), "unknown question type 'maybe'"),
        (json.dumps({**REQUEST, "questions": {"q": {"type": "choice", "criteria": {}}}}), "got 0"),
        (json.dumps({**REQUEST, "questions": {"q": {"type": "choice", "criteria": {"a": None}}}}), "got 1"),
        (
            json.dumps(
                {**REQUEST, "questions": {"q": {"type": "choice", "criteria": {str(i): None for i in range(256)}}}}
            ),
            "got 256",
        ),
        (json.dumps({**REQUEST, "state": None}), "state is required"),
    ],
)
def test_bad_input_exits_non_zero_with_a_message(body, message):
    done = typedlm("ask", stdin=body)
    assert done.returncode == 2
    assert message in done.stderr and done.stdout == ""


def test_a_missing_file_and_a_missing_model_are_clear_errors(tmp_path):
    done = typedlm("ask", str(tmp_path / "nope.json"))
    assert done.returncode == 2 and "cannot read" in done.stderr
    done = typedlm("ask", "--model", str(tmp_path / "missing.gguf"), stdin=json.dumps(REQUEST))
    assert done.returncode == 3 and "does not exist" in done.stderr


def test_a_hub_id_that_cannot_be_fetched_fails_at_once(tmp_path):
    # no cached copy and an unreachable hub: a clear error in seconds, not transformers' minute of retries
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "typedlm.cli", "ask", "--model", "nobody/no-such-model"],
        input=json.dumps(REQUEST),
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 3 and "cannot be reached" in done.stderr and "typedlm models" in done.stderr
    assert time.monotonic() - started < 45


def test_ask_refuses_a_model_the_request_does_not_mean(embedded_dir):
    done = typedlm("ask", stdin=json.dumps({**REQUEST, "model": "gpt-9"}))
    assert done.returncode == 2 and "unknown model 'gpt-9'" in done.stderr and "jev-latest" in done.stderr
    assert done.stdout == ""


def test_calibrate_help_states_the_split_it_uses():
    assert "(default train)" in typedlm("calibrate", "--help").stdout
    assert "(default held_out)" in typedlm("eval", "--help").stdout


def test_every_serve_option_with_a_default_says_what_it_is():
    from typedlm.cli import build_parser

    parser = build_parser()
    serve = next(a for a in parser._subparsers._group_actions[0].choices.items() if a[0] == "serve")[1]
    unsaid = [
        action.option_strings[0]
        for action in serve._actions
        if action.option_strings
        and action.help
        and action.nargs != 0  # a flag's default is its absence
        and "default" not in action.help
        and "(0: off" not in action.help
    ]
    assert unsaid == [], f"serve --help gives no default for {unsaid}"


def test_serve_on_a_port_in_use_exits_4_before_loading_the_model():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        # a model that would take minutes to fail if it were loaded first
        done = typedlm("serve", "--port", str(port), "--model", "nobody/no-such-model")
    assert done.returncode == 4 and f"127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "model" not in done.stderr.split("cannot listen")[0]  # nothing about the model was said or loaded
    assert time.monotonic() - started < 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serving(port: int, *options: str, env: dict | None = None) -> subprocess.Popen:
    """`typedlm serve` on `port` in a subprocess, once its /health answers (killed if it never does)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "typedlm.cli", "serve", "--port", str(port), *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    try:
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return server
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
    except BaseException:
        server.kill()
        server.wait()
        raise


def test_serve_with_env_and_flag_keys_finishes_in_flight_requests_on_sigterm(embedded_dir):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "TYPEDLM_API_KEYS": "env-key, other-key"}
    server = _serving(port, "--api-key", "flag-key", env=env)
    try:
        slow = {**REQUEST, "state": "A long complaint about a parcel. " * 300}
        for key in ("flag-key", "env-key", "other-key"):
            assert httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}).status_code == 200
        assert httpx.get(url + "/v1/models").status_code == 401
        results = {}
        headers = {"authorization": "Bearer env-key"}
        worker = threading.Thread(
            target=lambda: results.setdefault(
                "r", httpx.post(url + "/v1/systemone", json=slow, headers=headers, timeout=300)
            )
        )
        worker.start()
        while httpx.get(url + "/health").json()["pending"] < 1:
            time.sleep(0.01)
        server.send_signal(signal.SIGTERM)  # while the request is in flight
        worker.join(timeout=300)
        assert results["r"].status_code == 200 and set(results["r"].json()["answers"]) == set(REQUEST["questions"])
        assert server.wait(timeout=120) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it is done
    finally:
        server.kill()
        server.wait()


def test_keys_from_env():
    assert keys_from_env({"TYPEDLM_API_KEYS": " a, ,b ,"}) == ("a", "b")
    assert keys_from_env({}) == ()


def _model_process_of(server_pid: int) -> int:
    """The pid of `serve`'s model process: the child of the server running the spawned interpreter's main."""
    children = Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split()
    spawned = [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert len(spawned) == 1, children
    return spawned[0]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux's /proc to find the model process")
def test_serve_stops_with_exit_3_when_its_model_process_dies(embedded_dir):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = _serving(port)
    try:
        assert httpx.post(url + "/v1/systemone", json=REQUEST, timeout=120).status_code == 200
        os.kill(_model_process_of(server.pid), signal.SIGKILL)
        assert server.wait(timeout=120) == 3
        stderr = server.stderr.read()
        assert "the model in a process of its own" in stderr
        assert "the model process exited (exit code -9)" in stderr
    finally:
        server.kill()
        server.wait()
