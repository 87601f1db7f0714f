"""Every code block of README.md and docs/*.md runs as written.

Which blocks run
    Fenced blocks tagged ``python`` (or ``py``), ``sh``, ``bash``, ``shell`` or ``console``.
    Untagged blocks and blocks tagged ``text``, ``ini``, ``json`` (program output, file layouts,
    configuration) are not run.

Markers: an HTML comment on the line right before the opening fence (invisible when rendered)
    ``<!-- snippet: continues -->``
        The block goes on from the previous runnable block of the page: Python blocks share one
        namespace (they run in one interpreter, in order) and shell blocks share the
        environment, the working directory and a member that an earlier block started. A block
        and the blocks that continue it are one test case, named by the page and the line of
        its first block (``README.md:26``).
    ``<!-- snippet: skip (reason) -->``
        The block is not run, and the reason (required) is the test's skip reason. Skips are for
        what a test cannot do as written: run the whole suite (``make test``), use a Docker
        engine, or start brokers on fixed ports.

How a case runs
    In a fresh working directory (``./data`` lands there) with ``examples/`` and ``tests/``
    linked into it, so paths written relative to the repository root work (what a block writes,
    say into ``docs/images``, lands in the working directory, not in the repository).

    Python blocks run in a fresh interpreter per case, as ``__main__``; a traceback names the
    page and line of the failing statement. The case fails if a block raises, or if the
    interpreter does not exit within 60 s after the last block (a member or a thread left
    running keeps a user's script from ending too).

    Shell blocks: when a block has lines starting with ``$ `` those are its commands (and the
    lines after one that ends in a backslash); the other lines are output. Otherwise every line
    is a command. Each command runs in bash with this interpreter's ``bin`` directory first on
    PATH (the ``jetwake`` command and ``python``) and must exit with 0; ``export`` and ``cd``
    carry over to later commands. ``jetwake member start`` runs in the background: the case
    waits until the member accepts connections, and at its end sends SIGTERM (a graceful
    shutdown) and requires the member to exit with 0 within 60 s.

Substitutions: the documented addresses become the test's own
    ``127.0.0.1:9092`` and ``localhost:9092`` -> the test's Kafka broker (``kafka_bootstrap``:
    ``KAFKA_BOOTSTRAP_SERVERS`` or a broker the session starts); such cases are marked
    ``integration`` and ``kafka``. ``127.0.0.1:5701`` -> a free port for the case's member:
    ``jetwake member start`` without ``--port`` gets ``--port`` with it, and
    ``JETWAKE_ADDRESS`` points the CLI at it. The further members of a documented cluster,
    ``5702`` to ``5709`` (in ``127.0.0.1:PORT`` and ``--port PORT``), get free ports too. ``--metrics-port 9090`` -> another free port, and ``127.0.0.1:9090`` (the
    dashboard's and metrics' address in a URL) -> the same port. ``.venv/bin/python`` (the
    project's interpreter, named from the repository root) -> the interpreter running the test.
    Cases with shell blocks start processes and are marked ``integration``; cases that run
    Spark (``SparkRunner`` or ``jetwake backfill``) are marked ``spark`` and ``integration``.
"""
from __future__ import annotations

import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.ports import free_port as _free_port
from support.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_TAGS = {"python", "py"}
SHELL_TAGS = {"sh", "bash", "console", "shell"}
BLOCK_TIMEOUT = 180.0   # seconds for one Python block or one shell command
EXIT_TIMEOUT = 60.0     # for an interpreter after its last block, or a member after SIGTERM

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,})[ \t]*(?P<tag>[\w+-]*)[^`]*$")
_MARKER = re.compile(r"^<!--\s*snippet:\s*(?P<body>.*?)\s*-->$")
_SKIP = re.compile(r"^skip\s*\((?P<reason>[^)]*\S[^)]*)\)$")
_KAFKA_ADDRESSES = ("127.0.0.1:9092", "localhost:9092")
_MEMBER_ADDRESS = "127.0.0.1:5701"
_SPARK_USES = ("SparkRunner", "jetwake backfill")
_PROJECT_PYTHON = re.compile(r"(?<![\w./-])\.venv/bin/python\b")
LINKED = ("examples", "tests")   # the repository's folders a case's working directory links


@dataclass
class Block:
    page: Path
    line: int            # line number of the first line of code (1-based)
    tag: str
    code: str
    marker: str | None   # the marker's text, e.g. "continues" or "skip (needs Docker)"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line - 1}"

    @property
    def runnable(self) -> bool:
        return self.tag in PYTHON_TAGS or self.tag in SHELL_TAGS


@dataclass
class Case:
    blocks: list[Block]
    skip_reason: str | None = None

    @property
    def name(self) -> str:
        return self.blocks[0].where

    @property
    def text(self) -> str:
        return "\n".join(b.code for b in self.blocks)

    @property
    def needs_kafka(self) -> bool:
        return any(a in self.text for a in _KAFKA_ADDRESSES)

    @property
    def needs_spark(self) -> bool:
        return any(use in self.text for use in _SPARK_USES)

    @property
    def has_shell(self) -> bool:
        return any(b.tag in SHELL_TAGS for b in self.blocks)


def fenced_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, each with the marker comment above it."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = m["indent"], m["fence"], m["tag"].lower()
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        above = lines[j].strip() if j >= 0 else ""
        marker = _MARKER.match(above)
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence)
                                        and lines[end].strip().strip("`") == ""):
            end += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                for ln in lines[i + 1:end]]
        blocks.append(Block(page, i + 2, tag, "\n".join(body) + "\n",
                            marker["body"] if marker else None))
        i = end + 1
    return blocks


def marker_problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the snippet markers of one page's blocks."""
    problems = []
    previous_runnable = False
    for b in blocks:
        if b.marker is not None:
            if not b.runnable:
                problems.append(f"{b.where}: a marker on a ```{b.tag or '(untagged)'} block, "
                                "which is never run; remove the marker")
            elif b.marker == "continues":
                if not previous_runnable:
                    problems.append(f"{b.where}: 'continues' but no runnable block before it "
                                    "on the page")
            elif b.marker.startswith("skip"):
                if not _SKIP.match(b.marker):
                    problems.append(f"{b.where}: a skip must give its reason: "
                                    "<!-- snippet: skip (why it cannot run here) -->")
            else:
                problems.append(f"{b.where}: unknown marker {b.marker!r}; use "
                                "'continues' or 'skip (reason)'")
        if b.runnable:
            previous_runnable = True
    return problems


def collect_cases() -> list[Case]:
    cases: list[Case] = []
    for page in PAGES:
        current: Case | None = None
        for b in fenced_blocks(page):
            if not b.runnable:
                continue
            if b.marker == "continues" and current is not None:
                current.blocks.append(b)   # a case that is skipped skips its continuation too
                continue
            skip = _SKIP.match(b.marker or "")
            current = Case([b], skip["reason"].strip() if skip else None)
            cases.append(current)
    return cases


CASES = collect_cases()


def _param(case: Case):
    marks = []
    if case.needs_kafka or case.needs_spark or case.has_shell:
        marks.append(pytest.mark.integration)
    if case.needs_kafka:
        marks.append(pytest.mark.kafka)
    if case.needs_spark:
        marks.append(pytest.mark.spark)
    if case.skip_reason:
        marks.append(pytest.mark.skip(reason=case.skip_reason))
    return pytest.param(case, marks=marks, id=case.name)


# ---------------------------------------------------------------------------------------------
# running a case
# ---------------------------------------------------------------------------------------------

_DRIVER = r"""
import json, os, sys, traceback
replies = os.fdopen(int(sys.argv[1]), "w", buffering=1)
namespace = {"__name__": "__main__", "__builtins__": __builtins__}
for message in sys.stdin:
    block = json.loads(message)
    code = "\n" * (block["line"] - 1) + block["code"]   # tracebacks show the page's lines
    try:
        exec(compile(code, block["page"], "exec"), namespace)
    except BaseException:
        replies.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\n")
        break
    replies.write(json.dumps({"ok": True}) + "\n")
"""


def _tail(path: Path, chars: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no output)"
    return text[-chars:] if text else "(no output)"


def shell_commands(code: str) -> list[str]:
    """The commands of a shell block (see the module docstring for the rules)."""
    lines = code.splitlines()
    prompted = any(ln.startswith("$ ") for ln in lines)
    commands: list[str] = []
    pending: str | None = None
    for ln in lines:
        if pending is not None:
            pending += "\n" + ln
            if not ln.rstrip().endswith("\\"):
                commands.append(pending)
                pending = None
            continue
        if prompted:
            if not ln.startswith("$ "):
                continue
            ln = ln[2:]
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        if ln.rstrip().endswith("\\"):
            pending = ln
        else:
            commands.append(ln)
    if pending is not None:
        commands.append(pending)
    return commands


@dataclass
class Session:
    """The state one case's blocks share: directory, environment, member, interpreter."""

    workdir: Path
    env: dict[str, str]
    member_port: int
    metrics_port: int
    members: list[tuple[subprocess.Popen, Path]] = field(default_factory=list)
    python: subprocess.Popen | None = None
    replies: int | None = None
    python_log: Path | None = None
    commands_run: int = 0
    extra_ports: dict[int, int] = field(default_factory=dict)

    def port_for(self, documented: int) -> int:
        """The free port that stands for a documented member port other than 5701."""
        if documented not in self.extra_ports:
            self.extra_ports[documented] = _free_port()
        return self.extra_ports[documented]

    # -- Python ---------------------------------------------------------------------------

    def run_python(self, block: Block, code: str) -> None:
        if self.python is None:
            read_end, write_end = os.pipe()
            self.python_log = self.workdir.parent / "python-output.log"
            with open(self.python_log, "wb") as log:
                self.python = subprocess.Popen(
                    [sys.executable, "-c", _DRIVER, str(write_end)], cwd=self.workdir,
                    env=self.env, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(write_end,), text=True)
            os.close(write_end)
            self.replies = read_end
        assert self.python.stdin is not None
        self.python.stdin.write(json.dumps({"page": str(block.page), "line": block.line,
                                            "code": code}) + "\n")
        self.python.stdin.flush()
        reply = self._read_reply(block)
        if not reply["ok"]:
            pytest.fail(f"{block.where}: the block raised\n{reply['error']}\n"
                        f"output:\n{_tail(self.python_log)}", pytrace=False)

    def _read_reply(self, block: Block) -> dict:
        deadline = time.monotonic() + BLOCK_TIMEOUT
        buf = b""
        while not buf.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"{block.where}: the block did not finish within "
                            f"{BLOCK_TIMEOUT:.0f} s\noutput:\n{_tail(self.python_log)}",
                            pytrace=False)
            ready, _, _ = select.select([self.replies], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.replies, 65536)
                if not chunk:
                    self.python.wait(10)
                    pytest.fail(f"{block.where}: the interpreter ended during the block (exit "
                                f"code {self.python.returncode})\noutput:\n"
                                f"{_tail(self.python_log)}", pytrace=False)
                buf += chunk
        return json.loads(buf)

    def finish_python(self) -> str | None:
        """Ends the interpreter; a problem text if it does not exit by itself."""
        if self.python is None:
            return None
        proc, self.python = self.python, None
        assert proc.stdin is not None
        proc.stdin.close()
        os.close(self.replies)
        try:
            code = proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return (f"the interpreter did not exit within {EXIT_TIMEOUT:.0f} s after the last "
                    "block: something the snippets started (a Member not shut down?) keeps it "
                    f"alive\noutput:\n{_tail(self.python_log)}")
        if code != 0:
            return f"the interpreter exited with {code}\noutput:\n{_tail(self.python_log)}"
        return None

    # -- shell ----------------------------------------------------------------------------

    def run_shell(self, block: Block, code: str) -> None:
        for command in shell_commands(code):
            try:
                words = shlex.split(command, comments=True)
            except ValueError:   # shell syntax shlex does not follow: not a member start
                words = []
            if words[:3] == ["jetwake", "member", "start"]:
                self._start_member(block, words)
            else:
                self._run_command(block, command)

    def _run_command(self, block: Block, command: str) -> None:
        self.commands_run += 1
        state = self.workdir.parent / f"state-{self.commands_run}"
        script = (f"set -o pipefail\n{command}\n__rc=$?\n"
                  f"env -0 > {shlex.quote(str(state))}.env\n"
                  f"pwd > {shlex.quote(str(state))}.cwd\nexit $__rc\n")
        try:
            proc = subprocess.run(["bash", "-c", script], cwd=self.env["PWD"], env=self.env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=BLOCK_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{block.where}: `{command}` did not end within {BLOCK_TIMEOUT:.0f} s"
                        f"\n{e.stdout or ''}{e.stderr or ''}", pytrace=False)
        if proc.returncode != 0:
            pytest.fail(f"{block.where}: `{command}` exited with {proc.returncode}\n"
                        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
                        f"{self._member_logs()}", pytrace=False)
        env_file = Path(f"{state}.env")
        if env_file.exists():
            pairs = [p.split("=", 1) for p in env_file.read_text().split("\0") if "=" in p]
            self.env = {k: v for k, v in pairs}
            self.env["PWD"] = Path(f"{state}.cwd").read_text().strip()

    def _start_member(self, block: Block, words: list[str]) -> None:
        args = list(words)
        if "--port" not in args:
            args += ["--port", str(self.member_port)]
        if "--metrics-port" in args:
            args[args.index("--metrics-port") + 1] = str(self.metrics_port)
        port = int(args[args.index("--port") + 1])
        exe = shutil.which("jetwake", path=self.env["PATH"])
        if exe is None:
            pytest.fail(f"{block.where}: no `jetwake` command next to {sys.executable}; install "
                        "the package (`make test` does)", pytrace=False)
        log = self.workdir.parent / f"member-{len(self.members) + 1}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([exe, *args[1:]], cwd=self.env["PWD"], env=self.env,
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT)
        self.members.append((proc, log))

        def serving() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"{block.where}: `{shlex.join(args)}` exited with "
                            f"{proc.returncode} before it served\n{_tail(log)}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False
        wait_until(serving, timeout=60, interval=0.1,
                   what=lambda: f"{block.where}: the member to accept connections on port "
                   f"{port}\n{_tail(log)}")

    def _member_logs(self) -> str:
        return "".join(f"\nmember log ({log.name}):\n{_tail(log)}" for _, log in self.members)

    def stop_members(self) -> list[str]:
        """SIGTERM to every member the case started; problems if one does not end cleanly."""
        problems = []
        for proc, log in self.members:
            if proc.poll() is not None:
                problems.append(f"the member exited early with {proc.returncode}\n{_tail(log)}")
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                problems.append(f"the member did not exit within {EXIT_TIMEOUT:.0f} s of "
                                f"SIGTERM\n{_tail(log)}")
                continue
            if code != 0:
                problems.append(f"the member exited with {code} after SIGTERM\n{_tail(log)}")
        self.members = []
        return problems


def _substitute(code: str, session: Session, kafka: str | None) -> str:
    if kafka is not None:
        for address in _KAFKA_ADDRESSES:
            code = code.replace(address, kafka)
    code = code.replace(_MEMBER_ADDRESS, f"127.0.0.1:{session.member_port}")
    code = code.replace("127.0.0.1:9090", f"127.0.0.1:{session.metrics_port}")
    code = re.sub(r"--port 5701\b", f"--port {session.member_port}", code)
    code = _PROJECT_PYTHON.sub(lambda _: shlex.quote(sys.executable), code)
    # the further members of a documented cluster: 5702, 5703, ... each get a free port
    return re.sub(r"(127\.0\.0\.1:|--port )(570[2-9])\b",
                  lambda m: m.group(1) + str(session.port_for(int(m.group(2)))), code)


def _environment(workdir: Path, member_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JETWAKE_", "PYTEST_")) and k != "PYTHONPATH"}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["JETWAKE_ADDRESS"] = f"127.0.0.1:{member_port}"
    env["PWD"] = str(workdir)
    return env


# ---------------------------------------------------------------------------------------------
# the tests
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_doc_snippet_runs_as_written(case: Case, tmp_path: Path, request) -> None:
    if case.needs_spark:
        pytest.importorskip("pyspark")   # the `spark` extra, as for the Spark tests
    kafka = request.getfixturevalue("kafka_bootstrap") if case.needs_kafka else None
    workdir = tmp_path / "work"
    workdir.mkdir()
    for folder in LINKED:
        (workdir / folder).symlink_to(ROOT / folder)
    member_port = _free_port()
    session = Session(workdir, _environment(workdir, member_port), member_port, _free_port())
    problems: list[str] = []
    try:
        for block in case.blocks:
            code = _substitute(block.code, session, kafka)
            if block.tag in PYTHON_TAGS:
                session.run_python(block, code)
            else:
                session.run_shell(block, code)
    finally:
        problem = session.finish_python()
        if problem:
            problems.append(problem)
        problems += session.stop_members()
    assert not problems, f"{case.name}: " + "\n\n".join(problems)


def test_snippet_markers_are_well_formed() -> None:
    problems = [p for page in PAGES for p in marker_problems(fenced_blocks(page))]
    assert not problems, "\n".join(problems)


def test_the_snippets_of_the_pages_with_code_are_collected() -> None:
    """The parser finds the code of the pages that have some, and no case is empty."""
    pages = {c.blocks[0].page.name for c in CASES}
    assert {"README.md", "kafka.md", "fault-tolerance.md", "testing.md"} <= pages
    assert all(c.text.strip() for c in CASES)


def test_shell_commands_follow_prompts_and_continuations() -> None:
    block = ("$ jetwake submit job.py \\\n      --name a  # comment\n"
             "Job 'a' submitted\n$ jetwake list-jobs\nID NAME\n")
    assert shell_commands(block) == ["jetwake submit job.py \\\n      --name a  # comment",
                                      "jetwake list-jobs"]
    assert shell_commands("export A=1\n# a comment\njetwake cluster\n") == [
        "export A=1", "jetwake cluster"]
