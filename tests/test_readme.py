"""Every fenced code block in README.md runs here, the way a new user would run it.

The README is the first thing a user tries, so each block is executed as written, in a fresh
temporary directory, with the bundled models:

* ``python`` blocks run as scripts against a real gateway on 127.0.0.1:50051 started by the
  test, with a ``caller.wav`` that ends right after its speech (the case that once hung).
* ``bash`` blocks run command by command (``&&`` chains in order). ``voxgate serve`` starts in
  the background, its ``listening on`` line awaited, and serves the commands after it in the
  same block; it is stopped with SIGTERM at the block's end and must exit 0. ``voxgate call``
  gets the file it names (``my_recording.wav``) made from a shared clip. ``voxgate serve``
  with a model or voice path that does not exist here, or ``--device cuda`` without a GPU,
  must fail with exactly one line and exit code 2, never a traceback.
* ``text`` blocks are sample output; the only one is the demo's latency table, whose rows must
  be those ``voxgate demo`` prints.

A few steps are not run, each listed in :data:`NOT_RUN` with the reason and the cheap check
done instead. Anything else (a new block, a block without a language, a command or shell
syntax this file does not know) fails :func:`test_every_readme_block_is_runnable_here`: teach
this file how to run it rather than skipping it.

The ``voxgate serve --model /models/...`` and ``--voice /voices/...`` checks depend on serve
reporting a missing model or voice as one line with exit code 2 (gateway/config/).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO_ROOT, SPEECH_DIR

from voxgate.gateway.base import EngineHub
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.server import running_server
from voxgate_client import read_wav, write_wav

pytestmark = pytest.mark.model

README = REPO_ROOT / "README.md"
#: The README's Python example talks to this address; the test serves it there.
EXAMPLE_TARGET_PORT = 50051
#: caller.wav for the Python example: speech runs to the clip's last 100 ms, so without a
#: Flush no final transcript ever comes.
EXAMPLE_CALLER = "jfk_inaugural_1961.wav"
#: my_recording.wav for `voxgate call`, and a word its transcript must contain.
CALL_CLIP, CALL_WORD = "librispeech_1272-128104-0000.wav", "apostle"
#: A guard against a hung command (the bug this file was written for), not a speed check.
HANG_GUARD_S = 300

#: Steps that are not run, with why, mapped to the cheap check made in their place.
#: Keep this short: every entry is a check a user's first run gets and this test does not.
NOT_RUN: dict[str, str] = {
    # Creating a venv here would shadow the installed one the demo step must use.
    "python3 -m venv .venv": "venv",
    # Needs the package index (no network in CI's test step); .ci/run installs the same extras.
    ".venv/bin/pip install -e '.[piper,viz,turn]'": "extras",
    # The test command itself: it runs this file.
    "bash .ci/run": "ci",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    index: int
    lang: str
    text: str
    line: int

    @property
    def id(self) -> str:
        first = next((ln for ln in self.text.splitlines() if ln.strip()), "")
        return f"{self.index}-{self.lang or 'nolang'}-line{self.line}:{first[:40]}"


def readme_blocks() -> list[Block]:
    """Every fenced block, in order (a fence is three backticks at the start of a line)."""
    text = README.read_text(encoding="utf-8")
    blocks = []
    for i, m in enumerate(re.finditer(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", text, re.M | re.S)):
        blocks.append(Block(i, m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1))
    fences = len(re.findall(r"^```", text, re.M))
    assert fences == 2 * len(blocks), "README.md has an unclosed or odd code fence"
    return blocks


# --- bash: parse each line into steps, and say how each is run ------------------------------


@dataclass(frozen=True)
class Step:
    """One command of a bash block, and how this file runs it."""

    argv: tuple[str, ...]
    kind: str  # serve | serve-fails | call | demo | not-run
    comment: str = ""

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


def _voxgate(argv: list[str]) -> bool:
    return argv[0] in ("voxgate", ".venv/bin/voxgate")


def _has_cuda() -> bool:
    import ctranslate2  # noqa: PLC0415

    return bool(ctranslate2.get_cuda_device_count())


def classify(argv: list[str], comment: str) -> Step:
    """How one command is run; raises ValueError for a command this file does not know."""
    joined = shlex.join(argv)
    for known in NOT_RUN:
        if joined == shlex.join(shlex.split(known)):
            return Step(tuple(argv), "not-run", comment)
    if len(argv) >= 2 and _voxgate(argv):
        sub, args = argv[1], argv[2:]
        if sub == "serve":
            missing = [a for a in args if a.startswith("/") and not Path(a).exists()]
            cuda = any(a == "cuda" and b == "--device" for b, a in itertools.pairwise(args))
            if missing or (cuda and not _has_cuda()):
                return Step(tuple(argv), "serve-fails", comment)
            return Step(tuple(argv), "serve", comment)
        if sub == "call" and args and not args[0].startswith("-"):
            return Step(tuple(argv), "call", comment)
        if sub == "demo" and not args:
            return Step(tuple(argv), "demo", comment)
    raise ValueError(f"tests/test_readme.py does not know how to run: {joined}")


def bash_steps(block: Block) -> list[Step]:
    """The block's commands in order; ValueError for shell syntax beyond ``&&`` and comments."""
    steps: list[Step] = []
    for raw in block.text.replace("\\\n", " ").splitlines():
        m = re.search(r"(?:^|\s)#\s?(.*)$", raw)
        comment = m.group(1).strip() if m else ""
        tokens = shlex.split(raw, comments=True)
        if not tokens:
            continue
        for op in ("|", "||", ";", "&", ">", ">>", "<"):
            if op in tokens:
                raise ValueError(f"tests/test_readme.py does not run shell syntax {op!r}: {raw}")
        command: list[str] = []
        for tok in [*tokens, "&&"]:
            if tok == "&&":
                if not command:
                    raise ValueError(f"empty command in: {raw}")
                steps.append(classify(command, comment))
                command = []
            else:
                command.append(tok)
    if not steps:
        raise ValueError(f"README block at line {block.line} has no command")
    return steps


TEXT_BLOCK_HEADER = re.compile(r"latency\s+n\s+p50 ms\s+max ms")


def plan(block: Block) -> str:
    """How a block is run: ``python``, ``bash`` or ``text``; ValueError when unknown."""
    if block.lang == "python":
        return "python"
    if block.lang == "bash":
        bash_steps(block)
        return "bash"
    if block.lang == "text" and TEXT_BLOCK_HEADER.match(block.text):
        return "text"
    raise ValueError(
        f"README block at line {block.line} (```{block.lang}) is not known to "
        "tests/test_readme.py: give it a language and teach this file how to run it"
    )


BLOCKS = readme_blocks()


def test_every_readme_block_is_runnable_here() -> None:
    problems = []
    for block in BLOCKS:
        try:
            plan(block)
        except ValueError as exc:
            problems.append(str(exc))
    assert not problems, "\n".join(problems)


def test_an_unknown_block_or_command_fails_the_readme_test() -> None:
    # The guard itself: what a contributor adding a block would hit.
    with pytest.raises(ValueError, match="not known"):
        plan(Block(0, "", "some output\n", 1))
    with pytest.raises(ValueError, match="does not know how to run: curl"):
        plan(Block(0, "bash", "curl http://127.0.0.1:9100/metrics\n", 1))
    with pytest.raises(ValueError, match="shell syntax"):
        plan(Block(0, "bash", "voxgate demo | tee out.txt\n", 1))
    with pytest.raises(ValueError, match="not known"):
        plan(Block(0, "yaml", "engines: asr\n", 1))


# --- running ---------------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A fresh directory where ``.venv`` is the installed virtualenv (as after step 1)."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return tmp_path


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.prefix) / "bin")
    return {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONUNBUFFERED": "1",
        "COLUMNS": "100",
    }


def _exe(argv: tuple[str, ...], cwd: Path) -> list[str]:
    first = argv[0]
    path = cwd / first if "/" in first else shutil.which(first, path=_env()["PATH"])
    assert path is not None and Path(path).exists(), f"{first} not found"
    return [str(path), *argv[1:]]


def _run(argv: tuple[str, ...], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _exe(argv, cwd),
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        check=False,
    )


def _flag(argv: tuple[str, ...], name: str) -> str | None:
    for a, b in itertools.pairwise(argv):
        if a == name:
            return b
    return None


_demo_cache: dict[str, subprocess.CompletedProcess[str]] = {}


def run_demo_once(cwd: Path) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/voxgate demo`` once per session (the bash and text blocks both need it)."""
    if "demo" not in _demo_cache:
        proc = _run((".venv/bin/voxgate", "demo"), cwd)
        assert proc.returncode == 0, proc.stderr
        # What the README says the demo shows and writes.
        out = proc.stdout
        assert out.count("BARGE-IN: caller interrupted the bot") == 1, out
        assert out.count('caller: "') == 2, out
        assert "latency" in out and "timeline: call.png" in out, out
        for name in ("reply.wav", "call.png"):
            assert (cwd / name).stat().st_size > 10_000, name
        _demo_cache["demo"] = proc
    return _demo_cache["demo"]


def check_not_run(step: Step) -> None:
    """The cheap check in place of a step that is not run (see NOT_RUN)."""
    what = NOT_RUN[next(k for k in NOT_RUN if shlex.split(k) == list(step.argv))]
    if what == "venv":
        # The interpreter that made the running venv satisfies the README's "Python >= 3.11".
        assert sys.prefix != sys.base_prefix and sys.version_info >= (3, 11)
    elif what == "extras":
        extras = re.fullmatch(r"\.\[(.*)\]", step.argv[-1])
        assert extras is not None, step.text
        declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]
        assert set(extras.group(1).split(",")) <= set(declared), step.text
    elif what == "ci":
        # The README says it ends by running the test suite; the script must say so too.
        script = (REPO_ROOT / ".ci" / "run").read_text()
        assert script.rstrip().splitlines()[-1] == ".venv/bin/python -m pytest"


def check_serve_fails(step: Step, cwd: Path) -> None:
    proc = _run(step.argv, cwd)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "listening on" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("voxgate serve: "), proc.stderr
    missing = [a for a in step.argv if a.startswith("/") and not Path(a).exists()]
    if missing:  # the line names what is missing
        assert any(m in lines[0] for m in missing), lines[0]


def check_call(step: Step, cwd: Path) -> None:
    wav = cwd / step.argv[2]
    if not wav.exists():
        pcm, rate = read_wav(SPEECH_DIR / CALL_CLIP)
        write_wav(wav, pcm, rate)
    proc = _run(step.argv, cwd)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert CALL_WORD in proc.stdout.lower() and "latency" in proc.stdout, proc.stdout
    if _flag(step.argv, "--bot") == "echo":
        assert 'bot: "' in proc.stdout and "bot finished speaking" in proc.stdout, proc.stdout
    if (out := _flag(step.argv, "--out")) is not None:
        pcm, _ = read_wav(cwd / out)
        assert len(pcm) > 8000, out
    if (png := _flag(step.argv, "--timeline")) is not None:
        assert (cwd / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


class BackgroundServer:
    """``voxgate serve`` as a user starts it in another terminal."""

    def __init__(self, step: Step, cwd: Path) -> None:
        self.step = step
        self.stderr = ""
        self.proc = subprocess.Popen(
            _exe(step.argv, cwd),
            cwd=cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().rstrip("\n")  # blocks until SERVING (or exit)
        if not line.startswith("listening on "):
            self.stop()
            raise AssertionError(f"{step.text}: first line {line!r}; stderr {self.stderr!r}")
        self.line = line

    def stop(self) -> int:
        """SIGTERM, as a supervisor stops it; it drains and exits 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            _, self.stderr = self.proc.communicate(timeout=HANG_GUARD_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode


def run_bash_block(block: Block, cwd: Path) -> None:
    servers: list[BackgroundServer] = []
    try:
        for step in bash_steps(block):
            if step.kind == "not-run":
                check_not_run(step)
            elif step.kind == "demo":
                run_demo_once(cwd)
            elif step.kind == "serve-fails":
                check_serve_fails(step, cwd)
            elif step.kind == "serve":
                server = BackgroundServer(step, cwd)
                servers.append(server)
                if said := re.fullmatch(r'prints "(.*)"', step.comment):
                    assert server.line == said.group(1), (server.line, step.comment)
                if (port := _flag(step.argv, "--metrics-port")) not in (None, "0"):
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as r:
                        assert b"voxgate_" in r.read()
            elif step.kind == "call":
                check_call(step, cwd)
    finally:
        codes = [s.stop() for s in servers]
    assert codes == [0] * len(servers), [s.stderr for s in servers]


def latency_rows(text: str) -> list[tuple[str, str]]:
    """(row name, n) of a latency table; the numbers differ from run to run, these do not."""
    rows = []
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if TEXT_BLOCK_HEADER.match(ln))
    for ln in lines[start + 1 :]:
        m = re.fullmatch(r"(.+?)\s+(\d+)\s+(\d+|-)\s+(\d+|-)", ln.strip())
        if not m:
            break
        rows.append((m.group(1), m.group(2)))
    return rows


@pytest.fixture(scope="module")
def hub() -> EngineHub:
    """The bundled engines, loaded once for the Python blocks."""
    return build_hub(load_config(None, {"engines": "asr,tts"}))


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
async def test_readme_block_runs_as_written(
    block: Block, workdir: Path, request: pytest.FixtureRequest
) -> None:
    kind = plan(block)  # an unknown block fails here too
    if kind == "bash":
        await asyncio.to_thread(run_bash_block, block, workdir)
    elif kind == "text":
        demo = await asyncio.to_thread(run_demo_once, workdir)
        assert latency_rows(block.text) == latency_rows(demo.stdout), demo.stdout
    elif kind == "python":
        await run_python_block(block, workdir, request.getfixturevalue("hub"))


async def run_python_block(block: Block, cwd: Path, hub: EngineHub) -> None:
    pcm, rate = read_wav(SPEECH_DIR / EXAMPLE_CALLER)
    write_wav(cwd / "caller.wav", pcm, rate)
    script = cwd / f"readme_block_{block.index}.py"
    script.write_text(block.text, encoding="utf-8")
    env = {**_env(), "PYTHONPATH": str(REPO_ROOT)}
    async with running_server(hub=hub, server={"port": EXAMPLE_TARGET_PORT}) as srv:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            cwd=cwd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out_b, err_b = await asyncio.wait_for(proc.communicate(), HANG_GUARD_S)
        except TimeoutError:
            proc.kill()
            await proc.communicate()
            pytest.fail(f"README block at line {block.line} did not finish (hung)")
        assert srv.servicer is not None
        outcomes = dict(srv.servicer.calls.outcomes)
    out, err = out_b.decode(), err_b.decode()
    assert proc.returncode == 0, err
    # It printed what it heard, and the call ended by its hangup, not by a cancel.
    assert re.search(r"^caller: .*your country", out, re.M | re.I), out
    assert outcomes == {"ok": 1}, outcomes
