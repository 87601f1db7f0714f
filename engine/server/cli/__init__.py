"""The ``jetwake`` command line: run a member, and submit and manage jobs on it (after Jet's).

``main`` (:mod:`.main`) wires the commands into argparse: :mod:`.member_commands` (``member
start``, ``cluster``), :mod:`.job_commands` (``submit``, ``list-jobs``, ``status``,
``suspend``, ``resume``, ``restart``, ``cancel``) and :mod:`.snapshot_commands`
(``save-snapshot``, ``list-snapshots``, ``delete-snapshot``). :mod:`.pipeline_files` loads a
user's FILE.py, :mod:`.progress` draws the progress line of a waiting command, :mod:`.output`
formats tables and JSON, and :mod:`.errors` holds the exit codes.

Exit codes: 0 success; 1 the operation failed (unknown job or snapshot, wrong state, bad
FILE.py, job failed, timeout); 2 usage error; 3 no member reachable; 4 wrong or missing token;
130 interrupted.
"""

from jetwake.engine.server.cli.main import build_parser, main
from jetwake.engine.server.cli.pipeline_files import PipelineFileError, load_pipeline

__all__ = ["main", "build_parser", "load_pipeline", "PipelineFileError"]
