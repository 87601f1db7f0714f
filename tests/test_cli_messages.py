"""The command line's small messages, as a newcomer meets them: the token hint said once, an
unknown ``--from-snapshot`` name pointing at ``jetwake list-snapshots`` and leaving no job
behind, and FILE.py's wrong ``pipeline`` named in good English. The commands run in this
process (``main``) against a member service on a free loopback port."""

from __future__ import annotations

import pytest

from jetwake import Client, JobConfig, Member, Pipeline, Sinks, SnapshotNotFoundError, TestSources
from jetwake.engine.server.cli import PipelineFileError, load_pipeline, main
from jetwake.engine.server.member_service import MemberService

TOKEN = "messages-token"

PIPELINE_PY = """
from jetwake import Pipeline, Sinks, TestSources

def pipeline(args):
    p = Pipeline()
    p.read_from(TestSources.items([1, 2, 3])).write_to(Sinks.list("out"))
    return p
"""


@pytest.fixture
def service(tmp_path):
    member = Member(str(tmp_path / "data"))
    svc = MemberService(member, "127.0.0.1", 0, token=TOKEN).start()
    try:
        yield svc
    finally:
        svc.stop()
        member.shutdown(graceful=False)


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    monkeypatch.delenv("JETWAKE_TOKEN", raising=False)
    monkeypatch.delenv("JETWAKE_ADDRESS", raising=False)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_missing_token_is_explained_once(service, capsys):
    code, _, err = run(capsys, "list-jobs", "--address", service.address_text)
    assert code == 4
    assert err.count("\n") == 1 and "requires a token" in err
    assert err.count("--token or JETWAKE_TOKEN") == 1


def test_a_wrong_token_is_explained_once(service, capsys):
    code, _, err = run(capsys, "list-jobs", "--address", service.address_text, "--token", "x")
    assert code == 4
    assert "wrong token" in err and err.count("--token or JETWAKE_TOKEN") == 1


def test_an_unknown_from_snapshot_points_at_list_snapshots_and_submits_nothing(
        service, tmp_path, capsys):
    job_py = tmp_path / "job.py"
    job_py.write_text(PIPELINE_PY)
    code, out, err = run(capsys, "submit", str(job_py), "--from-snapshot", "ghost",
                         "--address", service.address_text, "--token", TOKEN)
    assert code == 1 and out == ""
    assert err.startswith("jetwake: error: no exported snapshot named 'ghost'")
    assert "`jetwake list-snapshots`" in err and "member.snapshots()" not in err
    assert err.count("\n") == 1
    with Client(service.address_text, token=TOKEN) as client:
        assert client.jobs() == []
    assert service.member.jobs() == []


def test_an_unknown_initial_snapshot_leaves_no_job_in_the_member():
    p = Pipeline()
    p.read_from(TestSources.items([1, 2, 3])).write_to(Sinks.list("out"))
    with Member() as m:
        with pytest.raises(SnapshotNotFoundError, match="no exported snapshot named 'nope'"):
            m.new_job(p, JobConfig(name="from-nothing", initial_snapshot_name="nope"))
        assert m.jobs() == [] and m.get_job("from-nothing") is None


@pytest.mark.parametrize("source, says", [
    ("pipeline = 5\n", "`pipeline` is an int, not a Pipeline"),
    ("pipeline = 'p'\n", "`pipeline` is a str, not a Pipeline"),
    ("def pipeline(args):\n    return 42\n", "pipeline(args) returned an int, not a Pipeline"),
    ("def pipeline(args):\n    return []\n", "pipeline(args) returned a list, not a Pipeline"),
    ("def pipeline(args):\n    pass\n", "pipeline(args) returned None, not a Pipeline"),
    ("class Item:\n    pass\n\ndef pipeline(args):\n    return Item()\n",
     "pipeline(args) returned an Item, not a Pipeline"),
])
def test_a_wrong_pipeline_is_named_with_its_article(tmp_path, source, says):
    path = tmp_path / "wrong.py"
    path.write_text(source)
    with pytest.raises(PipelineFileError) as e:
        load_pipeline(str(path))
    assert str(e.value).startswith(f"{path}: {says}")
