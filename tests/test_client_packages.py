"""The separately installable client packages, each in its own environment.

``voxgate-client`` is tested on protobuf 5.29, 6.x and 7.x, ``pipecat-voxgate`` inside Pipecat
(which needs protobuf < 7, so it cannot share this environment with the server) and
``livekit-plugins-voxgate`` inside LiveKit Agents. clients/setup-venvs.sh builds those
environments (CI runs it); each one's own pytest runs here as a subprocess against ONE real
server with the bundled models, started from this environment for the whole module. A missing
environment is a failure that says how to make it, never a skip.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from venvs import ROOT, venv_python

from voxgate_client.testing import (
    BOOSTABLE_NAMES,
    METRICS_ENV,
    SERVER_ENV,
    TARGET_ENV,
    LocalServer,
    name_heard_otherwise,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model]

CLIENTS = ROOT / "clients"


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    env = {SERVER_ENV: str(Path(sys.executable).parent / "voxgate")}
    saved = {k: os.environ.get(k) for k in (SERVER_ENV, TARGET_ENV)}
    os.environ.update(env)
    os.environ.pop(TARGET_ENV, None)
    try:
        with LocalServer() as srv:
            yield srv
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_suite(
    venv: str, project: str, server: LocalServer, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``project``'s tests with ``venv``'s pytest, from the project's own directory.

    The working directory is the project, not the repository root, so nothing of the server
    is importable by accident (``python -m pytest`` puts the working directory on sys.path).
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "VOXGATE_")) and k != "PYTHONPATH"
    }
    env |= {TARGET_ENV: server.target, METRICS_ENV: server.metrics, **extra_env}
    # A suite's test that needs a server of its own configuration (a short idle timeout)
    # starts one from the same executable.
    env[SERVER_ENV] = os.environ[SERVER_ENV]
    return subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [str(venv_python(venv)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"],
        cwd=CLIENTS / project,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def passed(out: subprocess.CompletedProcess[str], at_least: int) -> None:
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-6000:]
    m = re.search(r"(\d+) passed", text)
    assert m is not None and int(m.group(1)) >= at_least, text[-3000:]
    assert " skipped" not in text, text[-3000:]


# -- the client distribution ----------------------------------------------------------------------


def _serialized_descriptor(path: Path) -> bytes:
    """The FileDescriptorProto bytes a generated module registers (read, not imported:
    importing both would return the pool's one descriptor for either)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "AddSerializedFile"
        ):
            arg = node.args[0]
            assert isinstance(arg, ast.Constant) and isinstance(arg.value, bytes)
            return arg.value
    raise AssertionError(f"no AddSerializedFile in {path}")


@pytest.mark.unit
def test_client_stubs_carry_the_same_contract_as_the_server_stubs() -> None:
    """Fails when the proto changed and only one set of stubs was regenerated."""
    server = _serialized_descriptor(ROOT / "protos/voxgate/v1/voxgate_pb2.py")
    client = _serialized_descriptor(CLIENTS / "voxgate_client/_proto/voxgate_pb2.py")
    assert client == server, "run clients/voxgate-client/generate_stubs.sh and commit"


def test_client_stubs_equal_a_regeneration_with_the_oldest_gencode(tmp_path: Path) -> None:
    py = venv_python(".venv-client-pb5")
    subprocess.run(
        ["bash", str(CLIENTS / "voxgate-client/generate_stubs.sh"), str(py), str(tmp_path)],
        check=True,
    )
    for name in ("voxgate_pb2.py", "voxgate_pb2.pyi"):
        fresh = (tmp_path / name).read_text()
        committed = (CLIENTS / "voxgate_client/_proto" / name).read_text()
        assert fresh == committed, f"{name}: run clients/voxgate-client/generate_stubs.sh"
    assert "Protobuf Python Version: 5.29." in (tmp_path / "voxgate_pb2.py").read_text()


def test_client_wheel_holds_the_client_and_nothing_of_the_server(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(CLIENTS / "voxgate-client"),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("voxgate_client-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "voxgate_client/__init__.py",
        "voxgate_client/py.typed",
        "voxgate_client/_proto/voxgate_pb2.py",
        "voxgate_client/_proto/voxgate_pb2.pyi",
        "voxgate_client/data/sample_call.wav",
        "voxgate_client/_common/pcm.py",
    ):
        assert needed in names, needed
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"voxgate_client"}, tops


@pytest.mark.parametrize("major", ["5", "6", "7"])
def test_client_on_protobuf(major: str, server: LocalServer) -> None:
    out = run_suite(
        f".venv-client-pb{major}", "voxgate-client", server, VOXGATE_EXPECT_PROTOBUF=major
    )
    passed(out, 5)


# -- the framework adapters -----------------------------------------------------------------------


def test_pipecat_voxgate_in_pipecat(server: LocalServer) -> None:
    passed(run_suite(".venv-pipecat", "pipecat-voxgate", server), 5)


def test_livekit_plugins_voxgate_in_livekit_agents(server: LocalServer) -> None:
    passed(run_suite(".venv-livekit", "livekit-plugins-voxgate", server), 5)


@pytest.mark.parametrize("written", [0, 1, 3])
async def test_the_keyterm_name_is_the_first_this_machines_whisper_misspells(
    server: LocalServer, written: int
) -> None:
    """``name_heard_otherwise`` (both plugins' keyterm tests) with a FAKE recogniser that
    writes the first ``written`` names as spelled: the next name is taken, with the audio the
    recogniser was given; when every name is written, the test is told what was heard."""
    given: list[np.ndarray] = []

    async def hear(speech: np.ndarray) -> str:
        given.append(speech)
        name = BOOSTABLE_NAMES[len(given) - 1]
        return f"Please call {name} support after 6." if len(given) <= written else "Zor Black"

    if written == len(BOOSTABLE_NAMES):
        with pytest.raises(AssertionError, match="every name was heard without a boost"):
            await name_heard_otherwise(server.target, 16000, hear)
        assert len(given) == written
        return
    name, speech = await name_heard_otherwise(server.target, 16000, hear)
    assert name == BOOSTABLE_NAMES[written] and len(given) == written + 1
    assert speech is given[-1] and len(speech) > 2 * 16000  # a second of silence each side
    assert not speech[:16000].any() and speech[16000:-16000].any()


def test_framework_latency_benchmark_runs_in_its_tiny_mode(server: LocalServer) -> None:
    """benchmarks/framework_latency.py end to end (one clip, two sentences), so it never rots."""
    out = subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "benchmarks.framework_latency", "--tiny", "--target", server.target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    for framework in ("pipecat", "livekit"):
        assert f"{framework}: STT on the audio clock" in out.stdout, out.stdout
        assert f"{framework}: TTS request -> first audio" in out.stdout, out.stdout
    assert out.stdout.count("adapter added to each final") == 2, out.stdout
    assert out.stdout.count("adapter added to the first audio") == 2, out.stdout


def test_pipecat_turns_benchmark_runs_on_one_clip(server: LocalServer) -> None:
    """benchmarks/pipecat_turns.py end to end on Kennedy's sentence (its set's first clip), so
    it never rots: one user message per EndOfTurn, and the message the LLM reads is the
    EndOfTurn's text (the same WER)."""
    out = subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "benchmarks.pipecat_turns", "--clips", "1", "--sets", "real"]
        + ["--target", server.target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith("real"))
    _, calls, llm, end_of_turn, _, counts = row
    messages, turns = counts.split("/")
    assert calls == "1" and llm == end_of_turn and messages == turns != "0", out.stdout
