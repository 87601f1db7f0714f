"""``jetwake.snapshot``: the folder snapshot/, linked into the package as jetwake/snapshot.

Imported by the folder's own name from the repository root, it would be a second copy of every
module, with classes unequal to jetwake.snapshot's (two ``DAG`` classes, two registries), so that
import fails here, naming the right one.
"""
if __name__ != "jetwake.snapshot":
    raise ImportError(f"{__name__!r} is the folder snapshot/ of the jetwake repository; "
                      f"import it as 'jetwake.snapshot' (pip install -e .)")
